/**
 * src/dispatch/cpu-load.ts: busy when the machine's CPUs or this event loop were at least the
 * threshold utilised over the last window; read at most once a window.
 */
import t from 'tap'
import type { EventLoopUtilization } from 'node:perf_hooks'
import { CpuLoad, type CpuTimes } from '../../src/dispatch/cpu-load.ts'

/** A machine and an event loop whose counters the test moves by hand. */
function fakes() {
  const f = { at: 0, times: { busy: 0, idle: 0 } as CpuTimes, loopActive: 0, loopIdle: 0, machineReads: 0 }
  const loopAt = (): EventLoopUtilization => ({ idle: f.loopIdle, active: f.loopActive, utilization: 0 })
  const load = (threshold: number) =>
    new CpuLoad(
      { threshold, windowMs: 100 },
      {
        now: () => f.at,
        machine: () => {
          f.machineReads++
          return { ...f.times }
        },
        // performance.eventLoopUtilization's contract: with an earlier reading, the delta since it.
        eventLoop: (since) => {
          const now = loopAt()
          if (!since) return now
          const active = now.active - since.active
          const idle = now.idle - since.idle
          return { active, idle, utilization: active + idle > 0 ? active / (active + idle) : 0 }
        },
      },
    )
  /** `ms` pass with the machine `machine` busy (0-1, over all cores) and the loop `loop` busy. */
  const pass = (ms: number, machine: number, loop: number) => {
    f.at += ms
    f.times.busy += 2 * ms * machine
    f.times.idle += 2 * ms * (1 - machine)
    f.loopActive += ms * loop
    f.loopIdle += ms * (1 - loop)
  }
  return { f, load, pass }
}

t.test('busy from the threshold of the machine or of the event loop', async (t) => {
  const { load, pass } = fakes()
  const l = load(0.9)
  pass(100, 0.5, 0.3)
  t.equal(l.busy(), false, 'half the machine, a third of the loop: not busy')
  pass(100, 0.95, 0.3)
  t.equal(l.busy(), true, 'the machine at 95% (PostgreSQL beside it counts)')
  pass(100, 0.4, 0.92)
  t.equal(l.busy(), true, 'the loop at 92% on a machine with room (a container held to less than a core)')
  pass(100, 0.89, 0.89)
  t.equal(l.busy(), false, 'both just under')
})

t.test('read at most once a window; a reading covers the time since the last one', async (t) => {
  const { f, load, pass } = fakes()
  const l = load(0.9)
  const reads = f.machineReads
  pass(50, 1, 1)
  t.equal(l.busy(), false, 'within the first window: the last answer (none yet: not busy)')
  t.equal(f.machineReads, reads, 'nothing read')
  pass(50, 1, 1)
  t.equal(l.busy(), true, 'the window is over: read, busy')
  t.equal(f.machineReads, reads + 1)
  pass(10, 0, 0)
  t.equal(l.busy(), true, 'the same answer within the window')
  t.equal(f.machineReads, reads + 1)
  // A long quiet spell: the next reading averages it all.
  pass(10_000, 0, 0)
  t.equal(l.busy(), false)
})

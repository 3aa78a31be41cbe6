/**
 * src/dispatch/cpu-load.ts: busy once the machine's CPUs or this event loop reach `enter` over a
 * window, free again below `leave`; read at most once a window; a stale reading is not trusted.
 */
import t from '../helpers/tap.ts'
import type { EventLoopUtilization } from 'node:perf_hooks'
import { CpuLoad, cpuLoadAt, type CpuTimes } from '../../src/dispatch/cpu-load.ts'

/** A machine of two cores and an event loop whose counters the test moves by hand. */
function fakes() {
  const f = { at: 0, times: { busy: 0, idle: 0 } as CpuTimes, loopActive: 0, loopIdle: 0, machineReads: 0 }
  const load = () =>
    new CpuLoad(
      { enter: 0.9, leave: 0.8, windowMs: 100 },
      {
        now: () => f.at,
        machine: () => {
          f.machineReads++
          return { ...f.times }
        },
        // performance.eventLoopUtilization's contract: no argument, the counters; two, the later less the earlier.
        eventLoop: (later, earlier) => {
          if (!later) return { active: f.loopActive, idle: f.loopIdle, utilization: 0 }
          const active = later.active - (earlier?.active ?? 0)
          const idle = later.idle - (earlier?.idle ?? 0)
          return { active, idle, utilization: active + idle > 0 ? active / (active + idle) : 0 } satisfies EventLoopUtilization
        },
      },
    )
  /** `ms` pass with the machine `machine` busy (0-1, over both cores) and the loop `loop` busy. */
  const pass = (ms: number, machine: number, loop: number) => {
    f.at += ms
    f.times.busy += 2 * ms * machine
    f.times.idle += 2 * ms * (1 - machine)
    f.loopActive += ms * loop
    f.loopIdle += ms * (1 - loop)
  }
  return { f, load, pass }
}

t.test('busy from `enter` on the machine or the event loop, free again below `leave`', async (t) => {
  const { load, pass } = fakes()
  const l = load()
  pass(100, 0.5, 0.3)
  t.equal(l.busy(), false, 'half the machine, a third of the loop: not busy')
  pass(100, 0.89, 0.3)
  t.equal(l.busy(), false, 'just under 90%')
  pass(100, 0.95, 0.3)
  t.equal(l.busy(), true, 'the machine at 95% (PostgreSQL beside it counts)')
  pass(100, 0.85, 0.3)
  t.equal(l.busy(), true, 'still busy at 85%: the waits it turns on lower the load')
  pass(100, 0.75, 0.3)
  t.equal(l.busy(), false, 'free below 80%')
  pass(100, 0.4, 0.92)
  t.equal(l.busy(), true, 'the loop at 92% on a machine with room')
})

t.test('HOOKQ_LINGER_CPU_PERCENT: busy from the percent, free 10 points lower', async (t) => {
  t.same(cpuLoadAt(90), { enter: 0.9, leave: 0.8, windowMs: 250 })
  t.same(cpuLoadAt(5), { enter: 0.05, leave: 0, windowMs: 250 })
})

t.test('read at most once a window; a reading after a long quiet spell starts a window', async (t) => {
  const { f, load, pass } = fakes()
  const l = load()
  const reads = f.machineReads
  pass(50, 1, 1)
  t.equal(l.busy(), false, 'within the first window: no reading yet, not busy')
  t.equal(f.machineReads, reads, 'nothing read')
  pass(50, 1, 1)
  t.equal(l.busy(), true, 'the window is over: read, busy')
  t.equal(f.machineReads, reads + 1)
  pass(10, 0, 0)
  t.equal(l.busy(), true, 'the same answer within the window')
  t.equal(f.machineReads, reads + 1)
  // Ten seconds quiet, then a busy second: an average over both would say 9%.
  pass(10_000, 0, 0)
  t.equal(l.busy(), false, 'a stale baseline is not trusted')
  pass(100, 1, 1)
  t.equal(l.busy(), true, 'the window that follows is read')
})

t.test("the real gauge: an event loop held busy reads busy, whatever the machine's other load", async (t) => {
  const l = new CpuLoad()
  const until = performance.now() + 300
  while (performance.now() < until) {
    // Spin: this event loop is busy for the whole window.
  }
  t.equal(l.busy(), true)
})

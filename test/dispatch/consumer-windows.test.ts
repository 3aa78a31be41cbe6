/** A consumer's room (push window, maxConcurrency, rate) and who waits for it, on a clock and timers the test drives. */
import t from '../helpers/tap.ts'
import { ConsumerWindows } from '../../src/dispatch/consumer-windows.ts'
import type { GroupRuntime, PartitionState } from '../../src/dispatch/partition-state.ts'
import { boundedRate } from '../../src/core/consumer-limits.ts'
import { MAX_TIMER_DELAY_MS, timerDelayMs } from '../../src/core/timer-delay.ts'

/** ConsumerWindows with a clock the test sets, timers it fires, and the partitions it hands back to fill. */
function setup(initial: number) {
  const clock = { nowMs: 0 }
  const timers: { fn: () => void; ms: number }[] = []
  const filled: number[] = []
  const windows = new ConsumerWindows({
    options: { initial },
    now: () => clock.nowMs,
    timers: {
      setTimeout: (fn, ms) => timers.push({ fn, ms }),
      clearTimeout: () => {},
    },
    fill: (_g, w) => filled.push(w.partition),
  })
  return { clock, timers, filled, windows }
}

const g = { row: { name: 'g' } } as unknown as GroupRuntime
const part = (partition: number) => ({ partition }) as unknown as PartitionState

t.test('batch push: the window holds back a new batch, never a message joining one that is gathering', async (t) => {
  const { clock, timers, filled, windows } = setup(2)
  windows.limit('c', { rateLimitPerSecond: 3, maxConcurrency: null }, 1, true)
  const win = windows.of('c')
  t.ok(windows.hasRoom(win), 'the first message opens a batch')
  windows.started(win)
  windows.started(win)
  t.notOk(windows.hasRoom(win), 'the window (2) is full: no new batch')
  t.ok(windows.hasRoom(win, true), 'a third message still joins the batch gathering')
  windows.started(win)
  t.notOk(windows.hasRoom(win, true), 'the rate (3 a second) holds a fourth')

  // Partition 1's batch is gathering, partition 2 waits to open one.
  windows.wait(win, 'c', g, part(2))
  windows.wait(win, 'c', g, part(1), true)
  t.same(
    timers.map((x) => x.ms),
    [1000],
    'one timer, for when the rate lets the next message start',
  )
  clock.nowMs = 1000
  timers[0]!.fn()
  t.same(filled, [1], 'the rate wakes the gathering batch while the window still holds the new one')
  win.window.release('ok')
  windows.wake('c')
  t.same(filled, [1, 2], 'a push that ends wakes the partition waiting for the window')
})

t.test('a rate outside the range, or a small share of the slowest, sets timers that setTimeout holds', async (t) => {
  const { clock, timers, windows } = setup(8)
  // Stored before the range existed: held to the slowest rate allowed, one push every 10,000 s.
  windows.limit('c', { rateLimitPerSecond: 1e-9, maxConcurrency: null }, 1, false)
  const c = windows.of('c')
  windows.started(c)
  windows.wait(c, 'c', g, part(0))
  t.same(
    timers.map((x) => x.ms),
    [10_000_000],
  )
  // The slowest rate, of which this process pushes 1 partition in 1024: a 1.024e10 ms window.
  windows.limit('d', { rateLimitPerSecond: 0.0001, maxConcurrency: null }, 1 / 1024, false)
  const d = windows.of('d')
  windows.started(d)
  windows.wait(d, 'd', g, part(1))
  t.equal(timers[1]!.ms, MAX_TIMER_DELAY_MS, 'a longer wait is clamped to 2^31-1 ms')
  clock.nowMs = MAX_TIMER_DELAY_MS
  timers[1]!.fn()
  t.equal(timers.length, 3, 'fired before the rate allows a push, it arms once more')
  t.equal(timers[2]!.ms, MAX_TIMER_DELAY_MS)
})

t.test('the clamps', async (t) => {
  t.same([Number.NaN, -1, 0, 0.00005, 0.5, 2_000_000].map(boundedRate), [0.0001, 0.0001, 0.0001, 0.0001, 0.5, 1_000_000])
  t.same([Number.NaN, -5, 0, 1500, 2 ** 31, Number.POSITIVE_INFINITY].map(timerDelayMs), [
    0,
    0,
    0,
    1500,
    MAX_TIMER_DELAY_MS,
    MAX_TIMER_DELAY_MS,
  ])
})

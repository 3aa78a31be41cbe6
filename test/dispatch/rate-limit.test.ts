/** The rate limit's sliding window, on a clock the test sets. */
import t from '../helpers/tap.ts'
import { RateLimit } from '../../src/dispatch/rate-limit.ts'

/** Starts a push whenever the limit allows, stepping 1 ms at a time from 0 to `untilMs`: the start times. */
function drive(limit: RateLimit, untilMs: number, fromMs = 0): number[] {
  const starts: number[] = []
  for (let now = fromMs; now < untilMs; now++) {
    while (limit.waitMs(now) === 0) {
      limit.take(now)
      starts.push(now)
    }
  }
  return starts
}

/** The most starts in any window of `ms`. */
function most(starts: number[], ms: number): number {
  let best = 0
  for (let i = 0; i < starts.length; i++) {
    let j = i
    while (j < starts.length && starts[j]! - starts[i]! < ms) j++
    best = Math.max(best, j - i)
  }
  return best
}

t.test('a whole rate: exactly that many in any second, and no more over time', async (t) => {
  const starts = drive(new RateLimit(10), 5000)
  t.equal(most(starts, 1000), 10)
  t.equal(starts.length, 50, 'ten a second for five seconds')
})

t.test('a rate below one spaces single pushes', async (t) => {
  const starts = drive(new RateLimit(0.5), 10_000)
  t.same(starts, [0, 2000, 4000, 6000, 8000])
})

t.test('a rate with a fraction never exceeds it in any second', async (t) => {
  const starts = drive(new RateLimit(2.5), 10_000)
  t.ok(most(starts, 1000) <= 2.5)
  t.equal(most(starts, 1000), 2)
})

t.test('waitMs says when the next push may start', async (t) => {
  const limit = new RateLimit(2)
  limit.take(100)
  t.equal(limit.waitMs(100), 0)
  limit.take(300)
  t.equal(limit.waitMs(300), 800, 'the oldest start is a second old at 1100')
  t.equal(limit.waitMs(1100), 0)
})

t.test('a changed rate keeps the pushes already made', async (t) => {
  const limit = new RateLimit(10)
  const before = drive(limit, 500)
  t.equal(before.length, 10)
  limit.setRate(5)
  const after = drive(limit, 1000, 500)
  t.equal(after.length, 0, 'lowered: the ten of this second already exceed it')
  limit.setRate(20)
  t.equal(drive(limit, 1000, 999).length, 10, 'raised: ten more in the same second')
})

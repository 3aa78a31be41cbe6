import t from '../helpers/tap.ts'
import { honourRetryAfterMs, nextDelayMs, type RetryPolicy } from '../../src/core/retry-policy.ts'

// The contract's defaults for a group.
const DEFAULTS: RetryPolicy = { initialDelayMs: 1000, multiplier: 2, maxDelayMs: 60_000, jitter: 0.1 }
const NO_JITTER: RetryPolicy = { ...DEFAULTS, jitter: 0 }
const LOWEST = () => 0
const HIGHEST = () => 1 - 2 ** -53 // the largest value Math.random can return
const MIDDLE = () => 0.5

t.test('without jitter: exact exponential values, attempt 1 = initialDelayMs, then the cap', async (t) => {
  const delays = Array.from({ length: 9 }, (_, i) => nextDelayMs(i + 1, NO_JITTER))
  t.same(delays, [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000])
  t.equal(nextDelayMs(1, { initialDelayMs: 250, multiplier: 3, maxDelayMs: 10_000, jitter: 0 }), 250)
  t.equal(nextDelayMs(3, { initialDelayMs: 250, multiplier: 3, maxDelayMs: 10_000, jitter: 0 }), 2250)
  t.equal(nextDelayMs(4, { initialDelayMs: 100, multiplier: 1, maxDelayMs: 10_000, jitter: 0 }), 100, 'multiplier 1: constant')
  t.equal(nextDelayMs(2, { initialDelayMs: 100, multiplier: 1.5, maxDelayMs: 10_000, jitter: 0 }), 150, 'fractional multiplier')
  t.equal(nextDelayMs(2, { initialDelayMs: 333, multiplier: 1.5, maxDelayMs: 10_000, jitter: 0 }), 500, 'rounded to whole ms (499.5)')
})

t.test('huge attempts and zero delays stay finite, capped and integer', async (t) => {
  t.equal(nextDelayMs(5000, NO_JITTER), 60_000, '2^4999 overflows to Infinity; the cap holds')
  t.equal(nextDelayMs(5000, { ...NO_JITTER, initialDelayMs: 0 }), 0, 'no 0 * Infinity = NaN')
  t.equal(nextDelayMs(3, { ...DEFAULTS, maxDelayMs: 0 }, HIGHEST), 0)
  t.equal(nextDelayMs(3, { ...DEFAULTS, initialDelayMs: 0 }, HIGHEST), 0)
})

t.test('jitter spreads the delay within ±jitter of the capped value', async (t) => {
  t.equal(nextDelayMs(1, DEFAULTS, LOWEST), 900, 'random 0 gives -10%')
  t.equal(nextDelayMs(1, DEFAULTS, HIGHEST), 1100, 'random near 1 gives +10%')
  t.equal(nextDelayMs(1, DEFAULTS, MIDDLE), 1000, 'random 0.5 gives the centre')
  t.equal(nextDelayMs(4, DEFAULTS, LOWEST), 7200)
  t.equal(nextDelayMs(20, DEFAULTS, LOWEST), 54_000, 'the cap is spread too')
  t.equal(nextDelayMs(20, DEFAULTS, HIGHEST), 66_000, 'so a capped delay can reach maxDelayMs * (1 + jitter)')
  const seen = new Set<number>()
  for (let i = 0; i < 2000; i++) {
    const delay = nextDelayMs(3, DEFAULTS)
    if (!Number.isInteger(delay) || delay < 3600 || delay > 4400) t.fail(`out of bounds: ${delay}`)
    seen.add(delay)
  }
  t.ok(seen.size > 100, `Math.random by default actually spreads (${seen.size} distinct values)`)
})

t.test('never negative, whatever the jitter', async (t) => {
  t.equal(nextDelayMs(1, { ...DEFAULTS, jitter: 1 }, LOWEST), 0)
  t.equal(nextDelayMs(1, { ...DEFAULTS, jitter: 3 }, LOWEST), 0)
  t.equal(nextDelayMs(1, { ...DEFAULTS, jitter: 1 }, HIGHEST), 2000)
})

t.test('attempt must be an integer ≥ 1', async (t) => {
  for (const attempt of [0, -1, 1.5, NaN, Infinity]) t.throws(() => nextDelayMs(attempt, DEFAULTS), RangeError, String(attempt))
})

t.test("honourRetryAfterMs: at least the consumer's wish, capped at maxDelayMs", async (t) => {
  t.equal(honourRetryAfterMs(1000, 5000, DEFAULTS), 5000, 'a longer Retry-After wins')
  t.equal(honourRetryAfterMs(8000, 5000, DEFAULTS), 8000, 'a longer backoff wins')
  t.equal(honourRetryAfterMs(1000, 3_600_000, DEFAULTS), 60_000, 'capped at maxDelayMs')
  t.equal(honourRetryAfterMs(66_000, 3_600_000, DEFAULTS), 66_000, 'the cap never shortens the backoff')
  t.equal(honourRetryAfterMs(1000, 1500.2, DEFAULTS), 1501, 'rounded up: never earlier than asked')
  for (const none of [undefined, 0, -5, NaN, Infinity]) t.equal(honourRetryAfterMs(1000, none, DEFAULTS), 1000, `ignores ${none}`)
  t.equal(honourRetryAfterMs(nextDelayMs(2, NO_JITTER), 30_000, NO_JITTER), 30_000, 'composes with nextDelayMs')
})

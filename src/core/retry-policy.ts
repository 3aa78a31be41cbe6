/**
 * When to push a message again after a failed attempt: exponential backoff with a cap, spread by
 * ±jitter so that a consumer that comes back after an outage is not hit by every retry at once.
 * Pure functions; the randomness is a parameter so tests can pin it.
 *
 *   nextDelayMs(attempt, policy)                          the group's backoff after `attempt` failed
 *   honourRetryAfterMs(delayMs, retryAfterMs, policy)     the same, stretched to a consumer's Retry-After
 */

/** A group's retry settings (`retry` in `PUT /v1/groups/{group}`), validated at the HTTP boundary. */
export interface RetryPolicy {
  /** Delay after the first failed attempt, ms (≥ 0). */
  initialDelayMs: number
  /** Growth per further attempt (≥ 1 for a growing backoff). */
  multiplier: number
  /** Cap on the backoff before jitter, ms (≥ 0). */
  maxDelayMs: number
  /** Spread as a fraction of the delay: 0.1 means ±10% (0 to 1). */
  jitter: number
}

/**
 * The delay before the next push after attempt number `attempt` (1 = the first push) failed:
 * `min(maxDelayMs, initialDelayMs * multiplier^(attempt-1))`, then spread uniformly over
 * ±jitter of that value, so at the cap it can reach `maxDelayMs * (1 + jitter)`. An integer ≥ 0.
 * `random` returns a number in [0, 1) like Math.random.
 */
export function nextDelayMs(attempt: number, policy: RetryPolicy, random: () => number = Math.random): number {
  if (!Number.isInteger(attempt) || attempt < 1) throw new RangeError(`attempt must be an integer ≥ 1, got ${attempt}`)
  const { initialDelayMs, multiplier, maxDelayMs, jitter } = policy
  // multiplier^(attempt-1) overflows to Infinity near attempt 1000 (for 2): the cap absorbs it.
  // initialDelayMs 0 would make that 0 * Infinity = NaN, so it short-cuts to 0.
  const uncappedMs = initialDelayMs > 0 ? initialDelayMs * multiplier ** (attempt - 1) : 0
  // biome-ignore lint/complexity/useMathMinMax: a comparison, not Math.min: a NaN here takes the cap, never passes on
  const baseMs = uncappedMs < maxDelayMs ? uncappedMs : maxDelayMs
  const delayMs = Math.round(baseMs * (1 + jitter * (2 * random() - 1)))
  // biome-ignore lint/complexity/useMathMinMax: a comparison, not Math.max: a NaN delay becomes 0, never a NaN timer
  return delayMs > 0 ? delayMs : 0
}

/**
 * A consumer answered 429 or 503 with `Retry-After` (already converted to ms): wait at least that
 * long, but never longer than the group's `maxDelayMs`, so one answer cannot park a message for a
 * day. A longer backoff `delayMs` still wins: Retry-After says "not before", not "exactly then".
 * An absent, non-finite or non-positive `retryAfterMs` leaves `delayMs` unchanged.
 */
export function honourRetryAfterMs(delayMs: number, retryAfterMs: number | undefined, policy: RetryPolicy): number {
  if (retryAfterMs === undefined || !Number.isFinite(retryAfterMs) || retryAfterMs <= 0) return delayMs
  const wishMs = Math.min(Math.ceil(retryAfterMs), policy.maxDelayMs)
  return Math.max(wishMs, delayMs)
}

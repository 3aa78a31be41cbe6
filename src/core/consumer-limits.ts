/**
 * The range of a consumer's rateLimitPerSecond: the HTTP schema refuses a value outside it, and the
 * dispatcher holds a stored one (written before the range existed, or by hand) within it.
 *
 * At least 0.0001 a second, one push every 10,000 s (2 h 47 min): below the slowest quota a
 * consumer plausibly states (one an hour is 0.000278), and a consumer that should get less is
 * better paused. At most 1,000,000 a second, far above what one broker pushes.
 */

/** The slowest rate a consumer may ask for, pushes a second. */
export const RATE_LIMIT_MIN_PER_SECOND = 0.0001
/** The fastest, pushes a second. */
export const RATE_LIMIT_MAX_PER_SECOND = 1_000_000

/** A stored rate within the range (NaN, 0 and negatives: the slowest). */
export function boundedRate(perSecond: number): number {
  if (!(perSecond >= RATE_LIMIT_MIN_PER_SECOND)) return RATE_LIMIT_MIN_PER_SECOND
  return Math.min(perSecond, RATE_LIMIT_MAX_PER_SECOND)
}

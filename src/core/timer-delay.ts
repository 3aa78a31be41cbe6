/**
 * The one clamp for computed timer delays. Node's setTimeout holds at most 2^31-1 ms (about 24.8
 * days): a longer delay, or NaN, prints a TimeoutOverflowWarning and fires after 1 ms, and a caller
 * that arms again when its timer fires early then spins (a consumer rate of 1e-7 a second did, about
 * 900 times a second). Every timer whose delay is computed (from settings, clocks or data) takes it
 * through here; one that fires early finds nothing due yet and arms again, 24.8 days later at most.
 */

/** The longest delay setTimeout keeps, in ms. */
export const MAX_TIMER_DELAY_MS = 2 ** 31 - 1

/** `ms` within [0, 2^31-1] (NaN: 0), fit for setTimeout. */
export function timerDelayMs(ms: number): number {
  return ms > 0 ? Math.min(ms, MAX_TIMER_DELAY_MS) : 0
}

/** Polling instead of sleeping: wait until a condition holds, or fail after a generous limit. */
import { setTimeout as sleep } from 'node:timers/promises'

/**
 * Resolves with the first truthy value of `check`; rejects after `timeoutMs` with `what`. The limit
 * only ends a wait that failed, so it is generous: on a loaded 2-core machine (another suite beside
 * this one) a broker took 10+ s for what takes 100 ms alone, and 10 s defaults failed correct runs.
 */
export async function waitUntil<T>(
  check: () => T | Promise<T>,
  timeoutMs = 30_000,
  what = 'condition',
  everyMs = 10,
): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs
  let last: unknown
  for (;;) {
    try {
      const value = await check()
      if (value) return value as NonNullable<T>
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`)
    }
    await sleep(everyMs)
  }
}

/**
 * Waits out a window in which the test expects something not to happen (a push, a retry), for the
 * one kind of fixed wait a test may have: an absence has no condition to poll for. Say at the call
 * what must not happen, make the window longer than the moment it would come (a backoff, a
 * deadline), and use it only where nothing is due until the test acts again, so that a slow
 * machine can make the check miss a bug but never fail a correct broker. Where a state rules the
 * event out (nothing outstanding, nothing to push), wait for that state instead.
 */
export function absenceWindow(ms: number): Promise<void> {
  return sleep(ms)
}

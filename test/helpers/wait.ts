/** Polling instead of sleeping: wait until a condition holds, or fail after a generous limit. */
import { setTimeout as sleep } from 'node:timers/promises'

/** Resolves with the first truthy value of `check`; rejects after `timeoutMs` with `what`. */
export async function waitUntil<T>(
  check: () => T | Promise<T>,
  timeoutMs = 10_000,
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

/**
 * Text from outside (a consumer's answer quoted into an error, a protocol error naming the bytes it
 * met) as a PostgreSQL text column can hold it. PostgreSQL refuses NUL (22021), and one NUL in a
 * batched write failed every row of the batch, at every retry: the attempt log last month, consumer
 * health since. Every store function that writes such text passes it through here.
 */

/** Longest text kept, in UTF-16 units: an error is for reading, not a copy of the answer. */
export const STORABLE_MAX_CHARS = 1000

/**
 * `text` with NUL as U+FFFD, lone surrogates (a cut through a pair) as U+FFFD, and cut to `maxChars`
 * without splitting a pair; null and undefined become null.
 */
export function storableText(text: string | null | undefined, maxChars = STORABLE_MAX_CHARS): string | null {
  if (text === null || text === undefined) return null
  let out = text.length > maxChars ? text.slice(0, maxChars) : text
  if (out.includes('\u0000')) out = out.replaceAll('\u0000', '\uFFFD')
  return out.toWellFormed()
}

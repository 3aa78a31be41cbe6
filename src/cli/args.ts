/**
 * Parsers for option and argument values. They throw commander's InvalidArgumentError, which
 * commander reports as `error: option '--x <n>' argument 'y' is invalid. ...` (exit 2).
 */
import { InvalidArgumentError } from 'commander'

/** A parser for a whole number from `min` to `max`. */
export function wholeNumber(min = 0, max = Number.MAX_SAFE_INTEGER): (text: string) => number {
  return (text) => {
    if (!/^\d+$/.test(text.trim())) throw new InvalidArgumentError(`expected a whole number from ${min} to ${max}`)
    const n = Number(text.trim())
    if (n < min || n > max) throw new InvalidArgumentError(`expected a whole number from ${min} to ${max}`)
    return n
  }
}

/** A parser for a number (decimals allowed) from `min` to `max`. */
/** A partition number option (`-p, --partition`). */
export const partitionNumber = wholeNumber(0, 2_147_483_647)

export function decimal(min: number, max: number): (text: string) => number {
  return (text) => {
    const n = Number(text.trim())
    if (text.trim() === '' || !Number.isFinite(n) || n < min || n > max)
      throw new InvalidArgumentError(`expected a number from ${min} to ${max}`)
    return n
  }
}

/** A parser for an ISO-8601 timestamp; returns it normalised (`2026-01-01T00:00:00.000Z`). */
export function timestamp(text: string): string {
  const ms = Date.parse(text)
  if (!Number.isFinite(ms)) throw new InvalidArgumentError('expected an ISO-8601 timestamp such as 2026-01-01T00:00:00Z')
  return new Date(ms).toISOString()
}

/** A parser for repeatable `name=value` options, collected into one record. */
export function headerPair(text: string, previous: Record<string, string> = {}): Record<string, string> {
  const eq = text.indexOf('=')
  if (eq <= 0) throw new InvalidArgumentError('expected name=value')
  return { ...previous, [text.slice(0, eq)]: text.slice(eq + 1) }
}

/** A parser for one of a fixed set of words. */
export function oneOf<T extends string>(words: readonly T[]): (text: string) => T {
  return (text) => {
    if (!(words as readonly string[]).includes(text)) throw new InvalidArgumentError(`expected one of ${words.join(', ')}`)
    return text as T
  }
}

/** A --filter value: a JSON object (the broker checks its members). */
export function jsonObject(value: string): Record<string, unknown> {
  let parsed: unknown
  try {
    parsed = JSON.parse(value)
  } catch {
    throw new InvalidArgumentError('not JSON')
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new InvalidArgumentError('a JSON object is expected')
  return parsed as Record<string, unknown>
}

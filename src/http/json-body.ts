/**
 * The application/json body parser: Fastify's own (secure-json-parse, so `__proto__` and
 * `constructor.prototype` keys are refused as before), behind a linear scan that refuses a body
 * nested deeper than MAX_BODY_DEPTH before JSON.parse runs. Without it, 8 MB of `[[[…]]]` cost
 * seconds of event loop and hundreds of MiB to build millions of nested arrays, only to be refused
 * afterwards (by validation, or by JSON.stringify's stack in the produce path).
 */
import type { FastifyInstance } from 'fastify'
import { HookqError } from '../errors.ts'

/** How deep a message value may nest arrays and objects (`[[1]]` is 2). */
export const MAX_VALUE_DEPTH = 128
/** A produce body holds its values 3 levels down (`{"messages":[{"value": …}]}`). */
export const MAX_BODY_DEPTH = MAX_VALUE_DEPTH + 3

const QUOTE = 0x22
const BACKSLASH = 0x5c
const OPEN_SQUARE = 0x5b
const CLOSE_SQUARE = 0x5d
const OPEN_CURLY = 0x7b
const CLOSE_CURLY = 0x7d

/**
 * Whether `text` nests arrays and objects more than `max` levels deep, counting `[` and `{` outside
 * strings only. One pass: a string is skipped with indexOf to its closing quote (a quote after an
 * odd run of backslashes is escaped). Text that is not JSON gets an answer too; JSON.parse judges it.
 */
export function nestsDeeperThan(text: string, max: number): boolean {
  let depth = 0
  const n = text.length
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) {
      let end = i
      for (;;) {
        end = text.indexOf('"', end + 1)
        if (end < 0) return false // unterminated string: not JSON, JSON.parse says so
        let backslashes = 0
        while (text.charCodeAt(end - 1 - backslashes) === BACKSLASH) backslashes++
        if ((backslashes & 1) === 0) break
      }
      i = end
    } else if (c === OPEN_SQUARE || c === OPEN_CURLY) {
      if (++depth > max) return true
    } else if (c === CLOSE_SQUARE || c === CLOSE_CURLY) {
      depth--
    }
  }
  return false
}

/** Replaces the application/json parser with the depth-checked one (same limits and errors otherwise). */
export function installJsonParser(app: FastifyInstance): void {
  const parse = app.getDefaultJsonParser(app.initialConfig.onProtoPoisoning ?? 'error', app.initialConfig.onConstructorPoisoning ?? 'error')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
    const text = body as string // parseAs: 'string'
    if (nestsDeeperThan(text, MAX_BODY_DEPTH)) {
      done(
        new HookqError(
          'invalid_request',
          `the body is nested too deeply: more than ${MAX_BODY_DEPTH} levels of arrays and objects (a message value may nest ${MAX_VALUE_DEPTH})`,
        ),
        undefined,
      )
      return
    }
    parse(req, text, done)
  })
}

/**
 * The application/json body parser: Fastify's own, behind a linear scan that refuses, before
 * JSON.parse runs, a body nested deeper than MAX_BODY_DEPTH, an object wider than
 * MAX_OBJECT_MEMBERS and a body of more than MAX_BODY_MEMBERS object members in all. Without it,
 * 8 MB of `[[[…]]]` cost seconds of event loop and hundreds of MiB to build millions of nested
 * arrays, and a 10 MB object of 850k keys 2.2 s to parse (V8 builds each key into a dictionary),
 * only to be refused afterwards (by validation, by the message size, or by JSON.stringify's stack).
 */
import type { FastifyInstance } from 'fastify'
import { HookqError } from '../core/errors.ts'

/** How deep a message value may nest arrays and objects (`[[1]]` is 2). */
export const MAX_VALUE_DEPTH = 128
/** A produce body holds its values 3 levels down (`{"messages":[{"value": …}]}`). */
export const MAX_BODY_DEPTH = MAX_VALUE_DEPTH + 3

/**
 * Members one object may have. A 1 MiB message (the default limit) of short keys holds ~150k; an
 * object of 10,000 members parses in ~12 ms here, one of 100,000 in ~180 ms.
 */
export const MAX_OBJECT_MEMBERS = 10_000
/**
 * Object members a body may hold in all, whatever its objects: parsing costs ~0.8-2 us a member,
 * so this bounds the parse of an accepted body to ~0.2-0.5 s (1,000 messages of 250 members each).
 */
export const MAX_BODY_MEMBERS = 250_000

const QUOTE = 0x22
const COLON = 0x3a
const BACKSLASH = 0x5c
const OPEN_SQUARE = 0x5b
const CLOSE_SQUARE = 0x5d
const OPEN_CURLY = 0x7b
const CLOSE_CURLY = 0x7d

/** What the scan found past a limit, if anything. */
export type JsonShapeExcess = 'depth' | 'object_members' | 'body_members' | undefined

export interface JsonShapeLimits {
  maxDepth: number
  maxObjectMembers: number
  maxBodyMembers: number
}

/**
 * The first limit `text` passes: nesting of arrays and objects (counting `[` and `{`), members of
 * one object, or members in all (counting `:`, which valid JSON has once per member), all outside
 * strings. One pass: a string is skipped with indexOf to its closing quote (a quote after an odd
 * run of backslashes is escaped). Text that is not JSON gets an answer too; JSON.parse judges it.
 */
export function scanJsonShape(text: string, limits: JsonShapeLimits): JsonShapeExcess {
  const { maxDepth, maxObjectMembers, maxBodyMembers } = limits
  // Members of the object open at each depth (an array's entry stays 0: it has no colons).
  const members = new Int32Array(maxDepth + 2)
  let depth = 0
  let total = 0
  const n = text.length
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) {
      let end = i
      for (;;) {
        end = text.indexOf('"', end + 1)
        if (end < 0) return undefined // unterminated string: not JSON, JSON.parse says so
        let backslashes = 0
        while (text.charCodeAt(end - 1 - backslashes) === BACKSLASH) backslashes++
        if ((backslashes & 1) === 0) break
      }
      i = end
    } else if (c === COLON) {
      if (++members[depth]! > maxObjectMembers) return 'object_members'
      if (++total > maxBodyMembers) return 'body_members'
    } else if (c === OPEN_SQUARE || c === OPEN_CURLY) {
      if (++depth > maxDepth) return 'depth'
      members[depth] = 0
    } else if (c === CLOSE_SQUARE || c === CLOSE_CURLY) {
      if (depth > 0) depth--
    }
  }
  return undefined
}

/** Whether `text` nests arrays and objects more than `max` levels deep (outside strings). */
export function nestsDeeperThan(text: string, max: number): boolean {
  return scanJsonShape(text, { maxDepth: max, maxObjectMembers: Infinity, maxBodyMembers: Infinity }) === 'depth'
}

const BODY_LIMITS: JsonShapeLimits = { maxDepth: MAX_BODY_DEPTH, maxObjectMembers: MAX_OBJECT_MEMBERS, maxBodyMembers: MAX_BODY_MEMBERS }

/**
 * The problem for a body past a limit. Depth and one object's width are 400 invalid_request: the
 * value itself has a shape the broker does not take. Members in all are 413 body_too_large, like
 * bytes: the same messages sent in smaller calls are taken.
 */
function excessError(excess: Exclude<JsonShapeExcess, undefined>): HookqError {
  switch (excess) {
    case 'depth':
      return new HookqError(
        'invalid_request',
        `the body is nested too deeply: more than ${MAX_BODY_DEPTH} levels of arrays and objects (a message value may nest ${MAX_VALUE_DEPTH})`,
      )
    case 'object_members':
      return new HookqError('invalid_request', `an object in the body has more than ${MAX_OBJECT_MEMBERS} members`)
    case 'body_members':
      return new HookqError(
        'body_too_large',
        `the body holds more than ${MAX_BODY_MEMBERS} object members in all; send its messages in smaller calls`,
      )
  }
}

/**
 * Replaces the application/json parser with the shape-checked one (same byte limit and errors
 * otherwise). `__proto__` and `constructor.prototype` keys are kept, as JSON.parse keeps them: own
 * data properties, never a prototype. They are valid JSON, and a message value comes back as sent
 * (the SQL produce path always took them). Every other body's schema refuses members it does not
 * name, and no code copies a body into an object with Object.assign, where `__proto__` would act.
 */
export function installJsonParser(app: FastifyInstance): void {
  const parse = app.getDefaultJsonParser('ignore', 'ignore')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
    const text = body as string // parseAs: 'string'
    const excess = scanJsonShape(text, BODY_LIMITS)
    if (excess !== undefined) {
      done(excessError(excess), undefined)
      return
    }
    parse(req, text, done)
  })
}

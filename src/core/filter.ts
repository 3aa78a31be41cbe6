/**
 * A group's filter (contract v1.1 "Filters"): which messages the group is pushed. Compiled once
 * per group setting into closures; evaluated once per message, before a push is started.
 *
 *   { "key": "a", "headers.type": ["created", "updated"], "value.region": { "prefix": "eu-" },
 *     "value.total": { "gte": 10, "lt": 100 }, "$or": [ { ... }, { ... } ] }
 *
 * Every member must match (AND); `$or` matches when any of its filters does. A member's name says
 * what it tests: `key` (missing for a message without one), `headers.<name>` (the header, exactly as
 * named), or `value.<a.b.c>` (a path through the objects of a JSON value). A condition is a JSON
 * scalar (equal to it: same type and value), an array of scalars (equal to any), or an object of
 * operators: `prefix`, `exists`, `gt`/`gte`/`lt`/`lte` (several together form a range), `not`.
 *
 * A path that does not exist (a header not sent, a value that is not an object along the path)
 * matches nothing but `{ "exists": false }` (and `{ "not": { "exists": true } }`): a `not` is no
 * way to select messages that lack the field, as with SNS's anything-but.
 *
 * compileFilter throws FilterError naming the member that is not well formed, for the 400.
 */
import type { DispatchMessage } from './dispatch-message.ts'

/** The filter a group setting compiles to. */
export type MessageFilter = (msg: Pick<DispatchMessage, 'key' | 'value' | 'headers'>) => boolean

export class FilterError extends Error {}

/** Bounds that keep a filter cheap to evaluate and to store. */
const MAX_MEMBERS = 100
const MAX_DEPTH = 4
const MAX_CHOICES = 1000
const MAX_PATH_SEGMENTS = 16

/** What a member reads from a message, parsed at most once per message and evaluation. */
interface Subject {
  msg: Pick<DispatchMessage, 'key' | 'value' | 'headers'>
  value?: unknown
  headers?: Record<string, unknown>
}

/** A value that is not there (a missing header, a path that leads nowhere). */
const MISSING = Symbol('missing')
type Found = unknown | typeof MISSING

type Condition = (v: Found) => boolean

/** Compiles a filter as stored (its JSON) or as given; throws FilterError naming the bad member. */
export function compileFilter(filter: unknown): MessageFilter {
  const counter = { members: 0 }
  const test = compileObject(filter, 'filter', 0, counter)
  return (msg) => test({ msg })
}

function compileObject(filter: unknown, where: string, depth: number, counter: { members: number }): (s: Subject) => boolean {
  if (typeof filter !== 'object' || filter === null || Array.isArray(filter)) throw new FilterError(`${where} must be an object of members`)
  if (depth > MAX_DEPTH) throw new FilterError(`${where}: $or is nested more than ${MAX_DEPTH} deep`)
  const tests: ((s: Subject) => boolean)[] = []
  for (const [name, condition] of Object.entries(filter)) {
    if (++counter.members > MAX_MEMBERS) throw new FilterError(`${where}: a filter has at most ${MAX_MEMBERS} members in all`)
    const at = `${where}.${name}`
    if (name === '$or') {
      if (!Array.isArray(condition) || condition.length === 0) throw new FilterError(`${at} must be a non-empty array of filters`)
      const anyOf = condition.map((f, i) => compileObject(f, `${at}[${i}]`, depth + 1, counter))
      tests.push((s) => anyOf.some((f) => f(s)))
      continue
    }
    const read = reader(name, at)
    const cond = compileCondition(condition, at)
    tests.push((s) => cond(read(s)))
  }
  return (s) => {
    for (const t of tests) if (!t(s)) return false
    return true
  }
}

/** How a member's name reads the message. */
function reader(name: string, at: string): (s: Subject) => Found {
  if (name === 'key') return (s) => s.msg.key ?? MISSING
  const dot = name.indexOf('.')
  const head = dot < 0 ? name : name.slice(0, dot)
  const rest = dot < 0 ? '' : name.slice(dot + 1)
  if (head === 'headers' && rest !== '') {
    return (s) => {
      s.headers ??= JSON.parse(s.msg.headers) as Record<string, unknown>
      return Object.hasOwn(s.headers, rest) ? s.headers[rest] : MISSING
    }
  }
  if (head === 'value' && rest !== '') {
    const path = rest.split('.')
    if (path.length > MAX_PATH_SEGMENTS || path.some((p) => p === '')) {
      throw new FilterError(`${at}: a value path is up to ${MAX_PATH_SEGMENTS} non-empty names separated by dots`)
    }
    return (s) => {
      if (s.value === undefined) s.value = JSON.parse(s.msg.value)
      let v: unknown = s.value
      for (const p of path) {
        if (typeof v !== 'object' || v === null || Array.isArray(v) || !Object.hasOwn(v, p)) return MISSING
        v = (v as Record<string, unknown>)[p]
      }
      return v
    }
  }
  throw new FilterError(`${at}: a member is "key", "headers.<name>", "value.<path>" or "$or"`)
}

type Scalar = string | number | boolean | null

function isScalar(v: unknown): v is Scalar {
  return v === null || typeof v === 'string' || typeof v === 'boolean' || (typeof v === 'number' && Number.isFinite(v))
}

const RANGE = {
  gt: (a: number, b: number) => a > b,
  gte: (a: number, b: number) => a >= b,
  lt: (a: number, b: number) => a < b,
  lte: (a: number, b: number) => a <= b,
}
type RangeOp = keyof typeof RANGE

function compileCondition(c: unknown, at: string): Condition {
  if (isScalar(c)) return (v) => v === c
  if (Array.isArray(c)) {
    if (c.length === 0 || c.length > MAX_CHOICES || !c.every(isScalar)) {
      throw new FilterError(`${at}: an array condition holds 1 to ${MAX_CHOICES} strings, numbers, booleans or nulls`)
    }
    const choices = new Set<Scalar>(c)
    return (v) => v !== MISSING && isScalar(v) && choices.has(v)
  }
  if (typeof c !== 'object') throw new FilterError(`${at}: not a condition`)
  const ops = Object.keys(c)
  const o = c as Record<string, unknown>
  if (ops.length === 0) throw new FilterError(`${at}: an empty condition`)
  if (ops.every((k) => k in RANGE)) {
    const bounds = ops.map((k) => {
      const n = o[k]
      if (typeof n !== 'number' || !Number.isFinite(n)) throw new FilterError(`${at}.${k} must be a number`)
      return [RANGE[k as RangeOp], n] as const
    })
    return (v) => typeof v === 'number' && bounds.every(([cmp, n]) => cmp(v, n))
  }
  if (ops.length > 1)
    throw new FilterError(
      `${at}: one operator per condition (prefix, exists or not), or a range of gt, gte, lt, lte; got ${ops.join(', ')}`,
    )
  const op = ops[0]!
  const arg = o[op]
  switch (op) {
    case 'prefix':
      if (typeof arg !== 'string') throw new FilterError(`${at}.prefix must be a string`)
      return (v) => typeof v === 'string' && v.startsWith(arg)
    case 'exists':
      if (typeof arg !== 'boolean') throw new FilterError(`${at}.exists must be true or false`)
      return (v) => (v !== MISSING) === arg
    case 'not': {
      const inner = compileCondition(arg, `${at}.not`)
      // A missing field: only an exists inside can say something about it (see the header).
      const aboutExistence =
        typeof arg === 'object' && arg !== null && !Array.isArray(arg) && Object.keys(arg).length === 1 && 'exists' in arg
      return (v) => (v === MISSING && !aboutExistence ? false : !inner(v))
    }
    default:
      throw new FilterError(`${at}: unknown operator ${JSON.stringify(op)} (prefix, exists, gt, gte, lt, lte, not)`)
  }
}

/**
 * API key scopes: what each route declares it checks (RouteAccess), and the parsing of the
 * `key[:scope+scope]` syntax used by HOOKQ_API_KEYS and HOOKQ_API_KEYS_FILE. The rule of which
 * scope covers which call is src/security/access.ts.
 */

import { ACTIONS, type Action } from '../security/access.ts'

/** The actions a HOOKQ_API_KEYS entry may name after its `:` (a plain key is admin). */
export const SCOPES = ACTIONS
export type Scope = Action

/** One configured bearer key and what it may do (`admin` may do everything but scrape /metrics). */
export interface ApiKey {
  key: string
  scopes: Scope[]
}

/**
 * What a route checks, declared in its options (`config: { access }`), so that no route can be
 * added without one: test/http/route-access.test.ts walks the route table.
 * - `topic`: the action on the `:topic` of the path.
 * - `group`: the action on the `:group` of the path; a scope naming topics is checked against the
 *   group's topic, and for a write, against the `topic` and `deadLetterTopic` the body names too.
 * - `schedule`: the action on the topic of the `:name` schedule (as stored), and for a write on the
 *   `topic` the body names; a scope naming groups covers no schedule (a schedule has no group).
 * - `list`: any key may call it; the handler shows only what the key may see (`req.access`).
 * - `everything`: an admin scope without patterns (/v1/keys).
 * - `metrics`: the metrics action (GET /metrics), or no key when the operator opened it.
 * - `open`: no key (health, the docs, the console's files). Never under /v1.
 */
export type RouteAccess = { action: Action; on: 'topic' | 'group' | 'schedule' } | { on: 'list' | 'everything' | 'metrics' | 'open' }

declare module 'fastify' {
  interface FastifyContextConfig {
    access?: RouteAccess
  }
}

/** The route option that declares an access rule (spread into a route's options). */
export const access = (rule: RouteAccess) => ({ config: { access: rule } })

/** A key entry that cannot be used; config.ts turns it into a ConfigError. */
export class ApiKeySpecError extends Error {
  override name = 'ApiKeySpecError'
}

/**
 * Parses one `key` (admin) or `key:scope1+scope2` entry; `where` names its origin for messages.
 * The scopes follow the last `:`, so a key may itself contain `:` when its scopes are written out.
 */
export function parseKeyEntry(entry: string, where: string): ApiKey {
  const text = entry.trim()
  const colon = text.lastIndexOf(':')
  const key = colon < 0 ? text : text.slice(0, colon)
  if (key === '') throw new ApiKeySpecError(`${where}: an entry has an empty key`)
  if (/\s/.test(key)) throw new ApiKeySpecError(`${where}: a key must not contain whitespace`)
  if (colon < 0) return { key, scopes: ['admin'] }
  const names = text
    .slice(colon + 1)
    .split('+')
    .map((s) => s.trim())
  const scopes: Scope[] = []
  for (const name of names) {
    if (!(SCOPES as readonly string[]).includes(name)) {
      throw new ApiKeySpecError(`${where}: unknown scope ${JSON.stringify(name)} (scopes are ${SCOPES.join(', ')}, joined with +)`)
    }
    if (!scopes.includes(name as Scope)) scopes.push(name as Scope)
  }
  return { key, scopes }
}

// Where each parsed key was written (`HOOKQ_API_KEYS entry 2`, `… line 3`), for mergeKeys' message.
// Beside the keys, not in them: configurations are compared and logged as plain { key, scopes }.
const origins = new WeakMap<ApiKey, string>()

/** Parses a comma-separated list (HOOKQ_API_KEYS); blank entries are skipped. */
export function parseKeyList(list: string, where: string): ApiKey[] {
  const keys: ApiKey[] = []
  list.split(',').forEach((e, i) => {
    if (e.trim() === '') return
    const k = parseKeyEntry(e, where)
    origins.set(k, `${where} entry ${i + 1}`)
    keys.push(k)
  })
  return keys
}

/** Parses a keys file: one entry a line; blank lines and `#` comments (whole line or trailing) skipped. */
export function parseKeyFile(text: string, where: string): ApiKey[] {
  const keys: ApiKey[] = []
  text.split(/\r?\n/).forEach((line, i) => {
    const entry = line.replace(/(^|\s)#.*$/, '').trim()
    if (entry === '') return
    const k = parseKeyEntry(entry, `${where} line ${i + 1}`)
    origins.set(k, `${where} line ${i + 1}`)
    keys.push(k)
  })
  return keys
}

/**
 * Joins key lists; a key listed twice must have the same scopes both times (then it counts once).
 * The error names both places and the key's first characters, never the whole key: it is a secret
 * and the message goes to logs.
 */
export function mergeKeys(lists: ApiKey[][]): ApiKey[] {
  const byKey = new Map<string, ApiKey>()
  for (const k of lists.flat()) {
    const seen = byKey.get(k.key)
    if (!seen) byKey.set(k.key, k)
    else if ([...seen.scopes].sort().join('+') !== [...k.scopes].sort().join('+')) {
      const at = (x: ApiKey) => `${origins.get(x) ?? 'a list'} (${x.scopes.join('+')})`
      throw new ApiKeySpecError(`the API key ${keyHint(k.key)} is listed twice with different scopes: in ${at(seen)} and in ${at(k)}`)
    }
  }
  return [...byKey.values()]
}

/** `"ak_l…" (24 characters)`: enough to find a key in a file, at most a quarter of it (4 characters). */
function keyHint(key: string): string {
  const shown = key.slice(0, Math.min(4, Math.floor(key.length / 4)))
  return `${shown === '' ? '' : `${JSON.stringify(`${shown}…`)} `}(${key.length} characters)`
}

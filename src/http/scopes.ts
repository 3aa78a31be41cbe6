/**
 * API key scopes: which scope each /v1 route needs (ONE table, keyed by method and the route's
 * pattern as Fastify registered it, e.g. `POST /v1/groups/:group/acks`), and the parsing of the
 * `key[:scope+scope]` syntax used by HOOKQ_API_KEYS and HOOKQ_API_KEYS_FILE.
 */

export const SCOPES = ['produce', 'consume', 'admin'] as const
export type Scope = (typeof SCOPES)[number]

/** One configured bearer key and what it may do (`admin` may do everything). */
export interface ApiKey {
  key: string
  scopes: Scope[]
}

/**
 * The scope each /v1 route needs. A /v1 route missing here needs `admin`; a route outside /v1
 * (/healthz, /readyz, /metrics, /openapi.json, /docs) is open.
 */
export const ROUTE_SCOPES: Readonly<Record<string, Scope>> = {
  'POST /v1/topics/:topic/messages': 'produce',
  'GET /v1/topics/:topic/partitions/:partition/messages': 'produce',
  // What a produce with these keys would answer (duplicates and where): no more than producing tells.
  'POST /v1/topics/:topic/idempotency-keys': 'produce',
  // A topic's partitions and end offsets: what a producer (or a dead-letter replay) needs to know.
  'GET /v1/topics/:topic': 'produce',
  'POST /v1/groups/:group/acks': 'consume',
  'POST /v1/groups/:group/nacks': 'consume',
  'POST /v1/groups/:group/extend': 'consume',
  'GET /v1/groups/:group': 'consume',
  'GET /v1/groups/:group/deliveries': 'consume',
  // Everything else under /v1 (topic and group create/list/delete, consumers, seek): admin.
}

/**
 * The scope a matched route needs, from its method and registered pattern (routeOptions.url);
 * undefined means the route is open. HEAD follows GET.
 */
export function requiredScope(method: string, routeUrl: string): Scope | undefined {
  if (routeUrl !== '/v1' && !routeUrl.startsWith('/v1/')) return undefined
  const m = method.toUpperCase() === 'HEAD' ? 'GET' : method.toUpperCase()
  return ROUTE_SCOPES[`${m} ${routeUrl}`] ?? 'admin'
}

/** Whether a key holding `scopes` may call a route that needs `needed`. */
export function allows(scopes: readonly Scope[], needed: Scope): boolean {
  return scopes.includes('admin') || scopes.includes(needed)
}

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

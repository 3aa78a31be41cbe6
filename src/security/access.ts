/**
 * What an API key may do: its scopes, each an action with optional topic and group patterns, and
 * the one rule that says whether a scope covers a call. Pure: no I/O, used by the HTTP layer (every
 * /v1 route), the key service (validation) and the CLI.
 *
 * - A pattern is a name (`orders`) or a prefix ending in `*` (`orders.*`, or `*` for every name).
 * - A scope covers a call when its action is the call's action (or `admin`, which covers every
 *   action) and each list of patterns it names matches the call's resource: `topics` the topic (or
 *   every topic) the call touches, `groups` its group. A list it does not name covers all.
 * - A call that touches no group (a topic route) is not covered by a scope naming groups: an admin
 *   key for group `billing` may not delete topics. A call on a group touches the group's topic too,
 *   so a scope naming topics covers the groups consuming them.
 * - `metrics` is the scrape of GET /metrics: it takes no patterns.
 */

export const ACTIONS = ['produce', 'consume', 'admin', 'metrics'] as const
export type Action = (typeof ACTIONS)[number]

/** One scope of a key. */
export interface KeyScope {
  action: Action
  topics?: string[]
  groups?: string[]
}

/** What a call touches: the topics (the group's topic, a dead-letter topic, ...) and the group. */
export interface Resource {
  topics?: readonly string[]
  group?: string
}

const NAME = /^[A-Za-z0-9._-]{1,249}$/
const PREFIX = /^[A-Za-z0-9._-]{0,248}\*$/

/** Why a pattern is not one, or undefined when it is. */
export function patternError(pattern: string): string | undefined {
  if (NAME.test(pattern) || PREFIX.test(pattern)) return undefined
  return `${JSON.stringify(pattern)} is not a pattern: a name (letters, digits, . _ -) or a prefix of one ending in *`
}

/** Whether a name matches a pattern (a name, or a prefix ending in `*`). */
export function patternMatches(pattern: string, name: string): boolean {
  return pattern.endsWith('*') ? name.startsWith(pattern.slice(0, -1)) : pattern === name
}

const anyMatches = (patterns: readonly string[], name: string) => patterns.some((p) => patternMatches(p, name))

/** Whether `scope` covers `action` on `resource` (see the header). */
export function scopeCovers(scope: KeyScope, action: Action, resource: Resource): boolean {
  if (scope.action !== action && !(scope.action === 'admin' && action !== 'metrics')) return false
  if (scope.topics) {
    const topics = resource.topics ?? []
    if (topics.length === 0 || !topics.every((t) => anyMatches(scope.topics!, t))) return false
  }
  if (scope.groups && (resource.group === undefined || !anyMatches(scope.groups, resource.group))) return false
  return true
}

/** Whether any of the scopes covers the call. */
export function covers(scopes: readonly KeyScope[], action: Action, resource: Resource): boolean {
  return scopes.some((s) => scopeCovers(s, action, resource))
}

/** Whether any scope has the action (admin counts for all but metrics), whatever its patterns. */
export function hasAction(scopes: readonly KeyScope[], action: Action): boolean {
  return scopes.some((s) => s.action === action || (s.action === 'admin' && action !== 'metrics'))
}

/** An admin scope without patterns: the key may do everything, /v1/keys included. */
export function isUnrestrictedAdmin(scopes: readonly KeyScope[]): boolean {
  return scopes.some((s) => s.action === 'admin' && !s.topics && !s.groups)
}

/** Whether any scope names a topic pattern (a group route then needs the group's topic). */
export function namesTopics(scopes: readonly KeyScope[]): boolean {
  return scopes.some((s) => s.topics !== undefined)
}

/** Why a list of scopes cannot be a key's, or undefined. */
export function scopesError(scopes: readonly KeyScope[]): string | undefined {
  if (scopes.length === 0) return 'a key needs at least one scope'
  for (const [i, s] of scopes.entries()) {
    if (!(ACTIONS as readonly string[]).includes(s.action)) return `scopes[${i}]: unknown action ${JSON.stringify(s.action)}`
    if (s.action === 'metrics' && (s.topics || s.groups)) return `scopes[${i}]: a metrics scope takes no topics or groups`
    // A produce call touches a topic only: a produce scope naming groups would cover nothing.
    if (s.action === 'produce' && s.groups) return `scopes[${i}]: a produce scope takes topics, not groups`
    for (const [what, list] of [
      ['topics', s.topics],
      ['groups', s.groups],
    ] as const) {
      if (list === undefined) continue
      if (list.length === 0) return `scopes[${i}].${what}: leave it out to cover all ${what}, or name at least one pattern`
      for (const p of list) {
        const err = patternError(p)
        if (err) return `scopes[${i}].${what}: ${err}`
      }
    }
  }
  return undefined
}

/** `produce(topics=orders.*)`, for messages and the CLI. */
export function describeScope(s: KeyScope): string {
  const parts = [s.topics && `topics=${s.topics.join(',')}`, s.groups && `groups=${s.groups.join(',')}`].filter(Boolean)
  return parts.length === 0 ? s.action : `${s.action}(${parts.join(' ')})`
}

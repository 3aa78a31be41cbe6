/**
 * Bearer API keys, their scopes on every route, per-key rate limits, and the audit of admin writes.
 *
 * - Each route declares what it checks (`config.access`, see RouteAccess in scopes.ts); a /v1
 *   route that declares nothing needs an unrestricted admin key (closed, not open, by default).
 * - Keys come from HOOKQ_API_KEYS (compared as SHA-256 digests with timingSafeEqual against every
 *   configured key, without an early exit) and from POST /v1/keys (an exact lookup of the digest
 *   in the key service's memory: no database query per request). With no HOOKQ_API_KEYS the API is
 *   open, as in v1, and stored keys are not consulted.
 * - onRequest: no or unknown key, expired or deleted: 401 `unauthorized`. A key without the
 *   route's action in any scope: 403 `forbidden`, before the body is read.
 * - preValidation: the topic or group the call touches must match a scope's patterns (403
 *   otherwise), checked before validation so a forbidden caller learns nothing from a 400. A group
 *   write naming a topic the group does not use yet (PUT: `topic`, `deadLetterTopic`) needs a scope
 *   that may administer topics: one limited to groups would otherwise read any topic through a
 *   group it points there.
 * - With a rate (requests a second), each key has a token bucket (burst = 2 × rate); without keys
 *   configured, each client IP has one. An empty bucket answers 429 `rate_limited` with Retry-After.
 * - Every write (not GET) an admin-action route answers for a key is logged at info with the key's
 *   id (`audit: "admin_write"`), never the key.
 */
import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { HookqError } from '../core/errors.ts'
import {
  covers,
  describeScope,
  hasAction,
  isUnrestrictedAdmin,
  namesTopics,
  type Action,
  type KeyScope,
  type Resource,
} from '../security/access.ts'
import { keyDigest, type KeyRecord } from '../service/keys.ts'
import type { ApiKey, RouteAccess } from './scopes.ts'
import { TokenBucket } from './token-bucket.ts'

export interface AuthOptions {
  /** Configured keys; none means the API is open. Plain strings are admin keys. */
  keys: readonly (ApiKey | string)[]
  /** Keys made with POST /v1/keys. */
  stored?: { lookup(key: string): StoredLookup | Promise<StoredLookup> }
  /** The topics a group route touches: the group's topic and dead-letter topic; null for no such group. */
  groupTopics?: (group: string) => Promise<string[] | null>
  /** The topics a group names now (its topic and dead-letter topic), for a write naming topics; null for no such group. */
  groupNamedTopics?: (group: string) => Promise<string[] | null>
  /** The topic of a schedule, for its routes' checks; null for no such schedule. */
  scheduleTopic?: (name: string) => Promise<string | null>
  /** Requests a second per key (per client IP without keys); 0 means no limit. */
  rateLimitPerS?: number
  /** GET /metrics needs no key (HOOKQ_METRICS_OPEN). */
  metricsOpen?: boolean
  /** The clock, for tests. */
  now?: () => number
}

/** A stored key's record, or why there is none ('stale': the keys cannot be read now). */
type StoredLookup = KeyRecord | 'expired' | 'stale' | undefined

/** What the caller's key may do; every request has one (`req.access`). */
export class RequestAccess {
  constructor(
    /** The key's id (`env:<n>` for HOOKQ_API_KEYS keys); null without keys. */
    readonly keyId: string | null,
    /** null: authentication is off, everything is allowed. */
    readonly scopes: readonly KeyScope[] | null,
  ) {}

  allows(action: Action, resource: Resource): boolean {
    return this.scopes === null || covers(this.scopes, action, resource)
  }

  /** Whether the key may read this topic (GET /v1/topics/{topic}): produce or admin on it. */
  seesTopic(topic: string): boolean {
    return this.allows('produce', { topics: [topic] })
  }

  /** Whether the key may read this group (GET /v1/groups/{group}): consume or admin on it. */
  seesGroup(group: string, topic: string): boolean {
    return this.allows('consume', { group, topics: [topic] })
  }
}

const OPEN = new RequestAccess(null, null)

declare module 'fastify' {
  interface FastifyRequest {
    /** What the caller's key may do (everything when authentication is off). */
    access: RequestAccess
    /**
     * Checks the caller's key again now, throwing what the key would get now (401 deleted or
     * expired, 503 when the keys cannot be read): for a request that waits (a long poll) and must
     * not answer for a key revoked meanwhile. A no-op for HOOKQ_API_KEYS keys and without keys.
     */
    recheckKey: () => Promise<void>
  }
}

const noRecheck = async (): Promise<void> => {}

/** How often a waiting request's stored key is looked up again (in memory): well inside the contract's 2 s. */
const KEY_WATCH_MS = 250

/**
 * Watches the request's key while it waits: calls `lost` once the key is deleted, expired or cannot
 * be checked (the caller then answers with req.recheckKey()'s error). Returns the stop function.
 * Every lookup is in memory; only a stale view of the keys waits for a read (KeyService.lookupFresh).
 */
export function watchKey(req: FastifyRequest, lost: () => void, everyMs = KEY_WATCH_MS): () => void {
  if (req.recheckKey === noRecheck) return () => {}
  let timer: NodeJS.Timeout | undefined
  let stopped = false
  const tick = () => {
    req.recheckKey().then(
      () => {
        if (!stopped) timer = setTimeout(tick, everyMs)
      },
      () => {
        if (!stopped) lost()
      },
    )
  }
  timer = setTimeout(tick, everyMs)
  return () => {
    stopped = true
    clearTimeout(timer)
  }
}

// Past this many buckets (one per client IP without keys), full ones are forgotten.
const MAX_IDLE_BUCKETS = 10_000

/** Buckets by an identity (key id or client IP), created full on first use. */
class RateLimiter {
  private readonly buckets = new Map<string, TokenBucket>()
  constructor(
    private readonly ratePerS: number,
    private readonly now: () => number,
  ) {}

  /** 0 when allowed, else whole seconds to wait (at least 1). */
  check(id: string): number {
    const now = this.now()
    let bucket = this.buckets.get(id)
    if (!bucket) {
      if (this.buckets.size >= MAX_IDLE_BUCKETS) {
        for (const [k, b] of this.buckets) if (b.isFull(now)) this.buckets.delete(k)
      }
      bucket = new TokenBucket(this.ratePerS, 2 * this.ratePerS, now)
      this.buckets.set(id, bucket)
    }
    const waitMs = bucket.take(now)
    return waitMs === 0 ? 0 : Math.max(1, Math.ceil(waitMs / 1000))
  }
}

function unauthorized(reply: FastifyReply, detail: string, invalidToken: boolean): HookqError {
  reply.header('www-authenticate', invalidToken ? 'Bearer error="invalid_token"' : 'Bearer')
  return new HookqError('unauthorized', detail)
}

function forbidden(req: FastifyRequest, needed: string, scopes: readonly KeyScope[]): HookqError {
  return new HookqError(
    'forbidden',
    `this API key needs ${needed} for ${req.method} ${req.routeOptions.url} (it has ${scopes.map(describeScope).join(', ')})`,
    { extra: { requiredScope: needed.split(' ')[0] } },
  )
}

/** The access rule of the matched route; undefined for no route (the 404 handler answers). */
function ruleOf(req: FastifyRequest): RouteAccess | undefined {
  // Read once: Fastify builds routeOptions afresh at each read (a dozen fields).
  const { url, config } = req.routeOptions
  if (url === undefined) return undefined
  const declared = config?.access
  if (declared) return declared
  return url === '/v1' || url.startsWith('/v1/') ? { on: 'everything' } : { on: 'open' }
}

/** A route as registered, with the access rule it declared. */
export interface RouteEntry {
  method: string
  url: string
  access: RouteAccess | undefined
}

const routeTables = new WeakMap<FastifyInstance, RouteEntry[]>()

/** Every route registered after installAuth, with its access rule (the route-walking test reads it). */
export function routeTable(app: FastifyInstance): readonly RouteEntry[] {
  return routeTables.get(app) ?? []
}

/** Installs authentication, scope checks, rate limits and the admin audit (each when configured). */
export function installAuth(app: FastifyInstance, opts: AuthOptions): void {
  app.decorateRequest('access', null as unknown as RequestAccess)
  app.decorateRequest('recheckKey', noRecheck)
  // A /v1 route that declares no access rule is refused at start-up, not left to a default.
  const table: RouteEntry[] = []
  routeTables.set(app, table)
  app.addHook('onRoute', (route) => {
    const declared = (route.config as { access?: RouteAccess } | undefined)?.access
    if (declared === undefined && (route.url === '/v1' || route.url.startsWith('/v1/'))) {
      throw new Error(`route ${String(route.method)} ${route.url} declares no access rule (config.access; see src/http/scopes.ts)`)
    }
    for (const method of Array.isArray(route.method) ? route.method : [route.method])
      table.push({ method, url: route.url, access: declared })
  })
  const keys = opts.keys.map((k): ApiKey => (typeof k === 'string' ? { key: k, scopes: ['admin'] } : k))
  const digests = keys.map((k) => keyDigest(k.key))
  // One access object per configured key, made once: the produce path allocates nothing for it.
  const envAccess = keys.map(
    (k, i) =>
      new RequestAccess(
        `env:${i + 1}`,
        k.scopes.map((action): KeyScope => ({ action })),
      ),
  )
  const limiter = opts.rateLimitPerS ? new RateLimiter(opts.rateLimitPerS, opts.now ?? Date.now) : undefined
  const authOn = keys.length > 0

  /** The configured key's index, -1 for none of them. Constant time over the configured keys. */
  const configured = (given: Buffer): number => {
    let found = -1
    digests.forEach((d, i) => {
      if (timingSafeEqual(d, given)) found = i
    }) // no early exit
    return found
  }

  // Read for each call, not remembered: a group deleted and made again on another topic (by any
  // process) must not be checked against the topic it had. One indexed read, and only for scopes
  // that name topics (an unrestricted admin, or scopes of groups alone, need none).
  const topicsOfGroup = async (group: string): Promise<string[] | null> => (await opts.groupTopics?.(group)) ?? null

  /** The stored key's record now, or the error it gets now. */
  const storedRecord = async (reply: FastifyReply, key: string): Promise<KeyRecord> => {
    const found = opts.stored?.lookup(key)
    const stored = found instanceof Promise ? await found : found
    if (stored === 'stale') {
      throw new HookqError('unavailable', 'the broker cannot read its API keys from the database now; retry', { retryAfterS: 1 })
    }
    if (stored === undefined) throw unauthorized(reply, 'the API key is not valid', true)
    if (stored === 'expired') throw unauthorized(reply, 'the API key has expired', true)
    return stored
  }

  // Not async: most calls (an open route, or no keys and no rate limit) need nothing awaited, and
  // a promise per request is what an async hook costs Fastify (a produce call is mostly such costs).
  app.addHook('onRequest', (req, reply, done) => {
    req.access = OPEN
    req.recheckKey = noRecheck
    const rule = ruleOf(req)
    if (rule === undefined || rule.on === 'open') return done()
    if (rule.on === 'metrics' && (opts.metricsOpen || !authOn)) return done()
    // Without keys every caller may do everything (req.access stays OPEN): only the rate limit is left.
    if (!authOn && !limiter) return done()
    admit(req, reply, rule).then(() => done(), done)
  })

  /** The key, the rate limit and the route's scope for a call that needs them (see the onRequest hook). */
  const admit = async (req: FastifyRequest, reply: FastifyReply, rule: RouteAccess): Promise<void> => {
    let identity: string
    if (authOn) {
      const header = req.headers.authorization
      const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
      if (!match) throw unauthorized(reply, 'send Authorization: Bearer <api key>', false)
      const index = configured(keyDigest(match[1]!))
      if (index >= 0) {
        req.access = envAccess[index]!
      } else {
        const key = match[1]!
        const stored = await storedRecord(reply, key)
        req.access = new RequestAccess(stored.id, stored.scopes)
        // A stored key's record never changes but by deletion or expiry: the same id still there is the same key.
        req.recheckKey = async () => {
          await storedRecord(reply, key)
        }
      }
      identity = `key:${req.access.keyId}`
    } else {
      identity = `ip:${req.ip}`
    }

    if (limiter) {
      const retryAfterS = limiter.check(identity)
      if (retryAfterS > 0) {
        throw new HookqError('rate_limited', `more than ${opts.rateLimitPerS} requests a second; retry after ${retryAfterS} s`, {
          retryAfterS,
        })
      }
    }

    const scopes = req.access.scopes
    if (scopes === null) return
    if (rule.on === 'everything') {
      if (!isUnrestrictedAdmin(scopes)) throw forbidden(req, 'admin (without topics or groups)', scopes)
    } else if (rule.on === 'metrics') {
      if (!hasAction(scopes, 'metrics') && !isUnrestrictedAdmin(scopes)) throw forbidden(req, 'metrics', scopes)
    } else if ('action' in rule && !hasAction(scopes, rule.action)) {
      throw forbidden(req, rule.action, scopes)
    }
  }

  if (!authOn) return

  app.addHook('preValidation', async (req) => {
    const rule = ruleOf(req)
    const scopes = req.access.scopes
    if (!rule || scopes === null || !('action' in rule)) return
    // An admin scope without patterns covers every call here: no lookups for it.
    if (rule.action !== 'metrics' && isUnrestrictedAdmin(scopes)) return
    const params = req.params as { topic?: unknown; group?: unknown; name?: unknown }
    const body = req.method !== 'GET' && req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {}
    let resource: Resource
    // Scopes that may grant a topic named by a write: not those limited to groups (see the header).
    let topicScopes = scopes
    if (rule.on === 'topic') {
      resource = { topics: [String(params.topic)] }
    } else if (rule.on === 'schedule') {
      const stored = await opts.scheduleTopic?.(String(params.name))
      const topics = [stored, body.topic].filter((t): t is string => typeof t === 'string')
      resource = { topics }
    } else {
      const group = String(params.group)
      const named = [body.topic, body.deadLetterTopic].filter((t): t is string => typeof t === 'string')
      resource = { group }
      if (namesTopics(scopes) || named.length > 0) {
        const current = (await topicsOfGroup(group)) ?? []
        const has = named.length > 0 ? ((await opts.groupNamedTopics?.(group)) ?? []) : []
        const added = named.filter((t) => !has.includes(t) && !current.includes(t))
        if (added.length > 0) topicScopes = scopes.filter((s) => s.topics !== undefined || s.groups === undefined)
        // An admin for orders.* must not point a group at another topic, nor dead-letter into one.
        if (namesTopics(scopes) || added.length > 0) resource = { group, topics: [...current, ...added] }
      }
    }
    if (!covers(topicScopes, rule.action, resource)) {
      const what =
        rule.on === 'topic'
          ? `topic ${resource.topics![0]}`
          : rule.on === 'schedule'
            ? `the topic of schedule ${String(params.name)}${resource.topics!.length > 0 ? ` (${resource.topics!.join(', ')})` : ''}`
            : `group ${resource.group}${resource.topics ? ` on topics ${resource.topics.join(', ')}` : ''}`
      throw forbidden(req, `${rule.action} on ${what}`, scopes)
    }
  })

  // The audit of admin writes: who (the key's id), what (method and route), and how it ended.
  app.addHook('onResponse', async (req, reply) => {
    const rule = ruleOf(req)
    // req.access is unset on a request refused before this plugin's onRequest (the request-target check).
    if (!rule || req.method === 'GET' || req.method === 'HEAD' || (req.access?.keyId ?? null) === null) return
    const admin = 'action' in rule ? rule.action === 'admin' : rule.on === 'everything'
    if (!admin) return
    req.log.info(
      {
        audit: 'admin_write',
        keyId: req.access.keyId,
        method: req.method,
        route: req.routeOptions.url,
        url: req.url,
        statusCode: reply.statusCode,
      },
      'admin write',
    )
  })
}

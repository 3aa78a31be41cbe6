/**
 * Bearer API keys with scopes, and per-key rate limits, for every /v1 route.
 *
 * - The scope a route needs comes from ROUTE_SCOPES (scopes.ts), looked up by the matched route's
 *   method and pattern (routeOptions.url), never by prefixes of the raw URL. Routes outside /v1
 *   (health, metrics, OpenAPI, docs) and unmatched URLs (404) are open.
 * - Keys are compared as SHA-256 digests with timingSafeEqual against every configured key without
 *   an early exit, so neither a key's content nor its length leaks through timing.
 * - No or unknown key: 401 `unauthorized` with `www-authenticate: Bearer`. A known key without the
 *   scope: 403 `forbidden`.
 * - With a rate (requests a second), each key has a token bucket (burst = 2 × rate); without keys
 *   configured, each client IP has one. An empty bucket answers 429 `rate_limited` with Retry-After.
 */
import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { HookqError } from '../errors.ts'
import { allows, requiredScope, type ApiKey } from './scopes.ts'
import { TokenBucket } from './token-bucket.ts'

const digest = (key: string) => createHash('sha256').update(key).digest()

export interface AuthOptions {
  /** Configured keys; none means the API is open. Plain strings are admin keys. */
  keys: readonly (ApiKey | string)[]
  /** Requests a second per key (per client IP without keys); 0 means no limit. */
  rateLimitPerS?: number
  /** The clock, for tests. */
  now?: () => number
}

// Past this many buckets (one per client IP without keys), full ones are forgotten.
const MAX_IDLE_BUCKETS = 10_000

/** Buckets by an identity (key index or client IP), created full on first use. */
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

/** Installs authentication, scope checks and rate limits (each only when configured). */
export function installAuth(app: FastifyInstance, opts: AuthOptions): void {
  const keys = opts.keys.map((k): ApiKey => (typeof k === 'string' ? { key: k, scopes: ['admin'] } : k))
  const digests = keys.map((k) => digest(k.key))
  const limiter = opts.rateLimitPerS ? new RateLimiter(opts.rateLimitPerS, opts.now ?? Date.now) : undefined
  if (keys.length === 0 && !limiter) return

  /** The index of the key the request presents, -1 for none or unknown. Constant time over keys. */
  const identify = (req: FastifyRequest): number | undefined => {
    const header = req.headers.authorization
    const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
    if (!match) return undefined
    const given = digest(match[1]!)
    let found = -1
    digests.forEach((d, i) => {
      if (timingSafeEqual(d, given)) found = i
    }) // no early exit
    return found
  }

  app.addHook('onRequest', async (req, reply) => {
    const routeUrl = req.routeOptions.url
    if (routeUrl === undefined) return // no such route: the 404 handler answers
    const needed = requiredScope(req.method, routeUrl)
    if (needed === undefined) return // open route

    let identity: string
    let key: ApiKey | undefined
    if (keys.length > 0) {
      const index = identify(req)
      if (index === undefined) throw unauthorized(reply, 'send Authorization: Bearer <api key>', false)
      if (index < 0) throw unauthorized(reply, 'the API key is not valid', true)
      key = keys[index]!
      identity = `key:${index}`
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

    if (key && !allows(key.scopes, needed)) {
      throw new HookqError(
        'forbidden',
        `this API key needs the ${needed} scope for ${req.method} ${routeUrl} (it has ${key.scopes.join(', ')})`,
        {
          extra: { requiredScope: needed },
        },
      )
    }
  })
}

/** The public keys of the broker's push JWTs, for GET /.well-known/jwks.json (see src/dispatch/jwt-keys.ts). */
import type { Queryable } from '../store/db.ts'
import { listPublishedJwtKeys } from '../store/jwt-keys.ts'

/** A JWK Set (RFC 7517 §5). */
export interface JwkSet {
  keys: Record<string, unknown>[]
}

export class JwksService {
  private cached: { set: JwkSet; untilMs: number } | undefined

  /**
   * `cacheMs`: how long one read of the keys is served, so that verifiers polling the JWKS do not
   * query the database each time; a rotation's propagation delay (minutes) is far longer.
   */
  constructor(
    private readonly db: Queryable,
    private readonly cacheMs = 200,
    private readonly now: () => number = Date.now,
  ) {}

  /** The keys published and not expired. */
  async list(): Promise<JwkSet> {
    const nowMs = this.now()
    if (this.cached && this.cached.untilMs > nowMs) return this.cached.set
    const rows = await listPublishedJwtKeys(this.db, new Date(nowMs))
    const set = { keys: rows.map((r) => JSON.parse(r.publicJwk) as Record<string, unknown>) }
    this.cached = { set, untilMs: nowMs + this.cacheMs }
    return set
  }
}

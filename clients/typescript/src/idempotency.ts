/**
 * Which pushes a consumer has already handled, so a redelivery of one (a lost ack, an ack deadline
 * that passed, a push timeout, a seek back) does not run the handler again. The broker delivers at
 * least once; this turns it into "handled once" for as long as the store remembers.
 *
 * The store is pluggable: anything with `has` and `add`, sync or async (Redis `SET NX EX`, a table
 * with a unique key, ...). The default keeps ids in memory: per process, lost on restart, bounded.
 * `add` runs after the handler, so a consumer that dies between the two runs it again; a
 * transactional store (`runOnce`, PgIdempotencyStore) records the id in the handler's own
 * transaction instead, and `transact` is how the consumer runs one.
 */

/** Remembers handled ids. Methods may return promises; a thrown error fails the push (it is retried). */
export interface IdempotencyStore {
  /** Whether `id` was added (and not yet forgotten). */
  has(id: string): boolean | Promise<boolean>
  /** Records `id` as handled. */
  add(id: string): void | Promise<void>
}

/**
 * A store that records ids in the same transaction as the handler's own writes (PgIdempotencyStore
 * for PostgreSQL), so the effects in that database happen exactly once: either both the writes and
 * the id commit, or neither does. The consumer recognises it by `runOnce` and passes `tx` to the
 * handler (`ctx.tx`).
 */
export interface TransactionalIdempotencyStore<Tx> {
  /**
   * In one transaction: records those of `ids` not recorded yet, runs `work(tx, fresh)` with them
   * (not at all when every id was recorded before), and commits. Resolves with the ids recorded now;
   * the others were handled before. When `work` throws, rolls back and rejects with its error; any
   * other rejection (a connection, BEGIN or COMMIT that failed) means nothing is known to be recorded.
   */
  runOnce(ids: readonly string[], work: (tx: Tx, fresh: readonly string[]) => Promise<void>): Promise<readonly string[]>
}

/** A transactional store is told from a plain one by its `runOnce`. */
export function isTransactional<Tx>(
  store: IdempotencyStore | boolean | TransactionalIdempotencyStore<Tx> | undefined,
): store is TransactionalIdempotencyStore<Tx> {
  return typeof store === 'object' && store !== null && typeof (store as Partial<TransactionalIdempotencyStore<Tx>>).runOnce === 'function'
}

/**
 * What came of one transaction: `done` with the items handled now (the others had been before);
 * `threw` when work threw (rolled back); `store` when the store failed, with `fresh` undefined
 * before work ran, else at COMMIT after it returned (rolled back, or in doubt until a redelivery
 * finds the id).
 */
export type TransactOutcome<M> =
  | { kind: 'done'; fresh: M[] }
  | { kind: 'threw'; error: unknown; fresh: M[] }
  | { kind: 'store'; error: unknown; fresh: M[] | undefined }

/** Runs `work` in one transaction of `store` recording the ids of `items`; says what came of it (never rejects). */
export async function transact<M, Tx>(
  store: TransactionalIdempotencyStore<Tx>,
  items: readonly M[],
  idOf: (item: M) => string,
  work: (tx: Tx, fresh: M[]) => Promise<void>,
): Promise<TransactOutcome<M>> {
  const freshOf = (ids: readonly string[]) => {
    const set = new Set(ids)
    return items.filter((m) => set.has(idOf(m)))
  }
  let fresh: M[] | undefined
  let threw: { error: unknown } | undefined
  try {
    const recorded = await store.runOnce(items.map(idOf), async (tx, ids) => {
      fresh = freshOf(ids)
      try {
        await work(tx, fresh)
      } catch (error) {
        threw = { error }
        throw error
      }
    })
    return { kind: 'done', fresh: freshOf(recorded) }
  } catch (error) {
    // Told apart by whether work threw (then fresh is set: work runs with it): the store rethrows
    // work's error after its ROLLBACK.
    return threw ? { kind: 'threw', error: threw.error, fresh: fresh! } : { kind: 'store', error, fresh }
  }
}

/** Limits of the in-memory store. */
export interface MemoryIdempotencyStoreOptions {
  /** Most ids kept; the oldest is forgotten first beyond it. Default 10 000 (~1 MB). */
  maxEntries?: number
  /** How long an id is kept, ms. Default 24 h: well past the broker's default retries (5 attempts, backoff capped at 60 s). */
  ttlMs?: number
  /** The clock, ms since the epoch; for tests. */
  now?: () => number
}

/**
 * The default store: a Map of id → expiry in insertion order. Every id gets the same TTL and `add`
 * moves an id to the end, so the oldest entry is always the first to expire: expired ids are
 * dropped from the front, O(1) each, and no timer runs.
 */
export class MemoryIdempotencyStore implements IdempotencyStore {
  private readonly expiries = new Map<string, number>()
  private readonly maxEntries: number
  private readonly ttlMs: number
  private readonly now: () => number

  constructor({ maxEntries = 10_000, ttlMs = 24 * 3600_000, now = Date.now }: MemoryIdempotencyStoreOptions = {}) {
    if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new RangeError(`maxEntries must be a whole number ≥ 1, got ${maxEntries}`)
    if (!(ttlMs > 0)) throw new RangeError(`ttlMs must be > 0, got ${ttlMs}`)
    this.maxEntries = maxEntries
    this.ttlMs = ttlMs
    this.now = now
  }

  /** Ids currently remembered (expired ones still at the front included until the next call). */
  get size(): number {
    return this.expiries.size
  }

  has(id: string): boolean {
    this.evictExpired()
    return this.expiries.has(id)
  }

  add(id: string): void {
    this.evictExpired()
    this.expiries.delete(id)
    this.expiries.set(id, this.now() + this.ttlMs)
    for (const oldest of this.expiries.keys()) {
      if (this.expiries.size <= this.maxEntries) break
      this.expiries.delete(oldest)
    }
  }

  private evictExpired(): void {
    const nowMs = this.now()
    for (const [id, expiresAtMs] of this.expiries) {
      if (expiresAtMs > nowMs) break
      this.expiries.delete(id)
    }
  }
}

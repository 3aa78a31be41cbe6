/**
 * Exactly-once effects in the consumer's own PostgreSQL database: the id of each handled message
 * (`<group>/<webhook-id>`) is inserted in the same transaction as the handler's writes.
 *
 *   BEGIN
 *   INSERT INTO hookq_handled (id) ... ON CONFLICT DO NOTHING RETURNING id
 *     no row back: handled before (committed) → ROLLBACK; the consumer acks without the handler
 *   the handler, with this transaction's client (ctx.tx)
 *     it throws → ROLLBACK: neither its writes nor the id stay; the consumer nacks
 *   COMMIT → the consumer acks
 *
 * Where a consumer can die, and what the redelivery then finds:
 *   before COMMIT    PostgreSQL rolls the transaction back when the connection drops: no writes,
 *                    no id, so the redelivery runs the handler (once more, for the first time)
 *   after COMMIT,    writes and id are both there: the redelivery is acked without the handler
 *   before the ack
 * A COMMIT whose answer is lost is one of the two; the redelivery tells which.
 *
 * Two pushes of one message at once (a push timeout, a redelivery to another consumer process):
 * the second INSERT of the same primary key waits for the first transaction. If it commits, the
 * second inserts nothing and answers "duplicate"; if it rolls back (or its process dies), the second
 * inserts and runs the handler. Under READ COMMITTED (PostgreSQL's default, used here) that needs
 * no lock of our own; the second push holds a pool connection while it waits.
 *
 * The package does not depend on `pg`: the pool and its clients are typed by what this file calls
 * (PgPoolLike, PgClientLike), which a node-postgres Pool satisfies, and the handler's `ctx.tx` is
 * typed as the pool's own client (a pg PoolClient for a pg Pool).
 */
import type { TransactionalIdempotencyStore } from './idempotency.ts'

/** What the store reads from a query's result (node-postgres's QueryResult has all of these). */
export interface PgResultLike {
  rows: Array<{ [column: string]: unknown }>
  rowCount: number | null
  /** The command tag: `COMMIT`, or `ROLLBACK` for a COMMIT of a transaction that had failed. */
  command?: string
}

/** A connection checked out of a pool: node-postgres's PoolClient, or anything with these two methods. */
export interface PgClientLike {
  query(text: string, values?: unknown[]): Promise<PgResultLike>
  /** Back to the pool; with an error, the connection is closed instead (it may be mid-transaction). */
  release(err?: Error | boolean): void
  /**
   * A node-postgres client emits 'error' when its connection ends, and a checked-out one has no
   * listener of the pool's: unheard, the error would end the process. The store listens while it
   * holds the client (the handler's next query then rejects), and closes it at release.
   */
  on?(event: 'error', listener: (err: Error) => void): unknown
  removeListener?(event: 'error', listener: (err: Error) => void): unknown
}

/** A pool with a promise `connect()`. */
export interface PgPoolLike<C extends PgClientLike = PgClientLike> {
  connect(): Promise<C>
}

/**
 * node-postgres's Pool declares `connect` twice, the promise form and then a callback form, and
 * TypeScript infers a type parameter from the last one only; matching both makes `C` its PoolClient.
 */
interface NodePostgresPoolLike<C extends PgClientLike> {
  connect(): Promise<C>
  connect(callback: (...args: never[]) => void): void
}

export interface PgIdempotencyStoreOptions<C extends PgClientLike> {
  /** A node-postgres `Pool` (or any PgPoolLike) of the database the handler writes to. */
  pool: NodePostgresPoolLike<C> | PgPoolLike<C>
  /** The table of handled ids, `name` or `schema.name` (letters, digits, `_`). Default `hookq_handled`. */
  table?: string
  /**
   * Create the table (and its index on handled_at) with `CREATE TABLE IF NOT EXISTS` on first use
   * (default true). Set false when the database role may not create tables, and run
   * `store.createTableSql` yourself (in a migration, say).
   */
  createTable?: boolean
}

/** Default table name. */
export const DEFAULT_HANDLED_TABLE = 'hookq_handled'

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

/**
 * The PostgreSQL transactional store: pass it as `idempotency` to createConsumer, and write through
 * `ctx.tx` in the handler. Ids stay until `prune` removes them (see there for how long to keep them).
 */
export class PgIdempotencyStore<C extends PgClientLike = PgClientLike> implements TransactionalIdempotencyStore<C> {
  private readonly pool: PgPoolLike<C>
  private readonly table: string
  private readonly createTable: boolean
  /** The CREATE TABLE once per store; forgotten when it fails, so the next message tries again. */
  private ready: Promise<void> | undefined
  /** The statements that create the table and its index, for `createTable: false`. */
  readonly createTableSql: string
  /** The index's name, quoted and in the table's schema. */
  private readonly index: string
  /** What createTableSql says, one statement each. */
  private readonly createStatements: readonly string[]

  constructor({ pool, table = DEFAULT_HANDLED_TABLE, createTable = true }: PgIdempotencyStoreOptions<C>) {
    if (typeof pool?.connect !== 'function') throw new TypeError('PgIdempotencyStore needs a pool with connect() (a node-postgres Pool)')
    const parts = table.split('.')
    if (parts.length > 2 || !parts.every((p) => IDENTIFIER.test(p))) {
      throw new TypeError(`table must be "name" or "schema.name" of letters, digits and _, got ${JSON.stringify(table)}`)
    }
    this.pool = pool
    // Quoted, so the name is used exactly as given (no case folding, no keyword clash).
    this.table = parts.map((p) => `"${p}"`).join('.')
    this.createTable = createTable
    const indexName = `"${`${parts.at(-1)}_handled_at`.slice(0, 63)}"`
    this.index = [...parts.slice(0, -1).map((p) => `"${p}"`), indexName].join('.')
    this.createStatements = [
      `CREATE TABLE IF NOT EXISTS ${this.table} (id text PRIMARY KEY, handled_at timestamptz NOT NULL DEFAULT now());`,
      `CREATE INDEX IF NOT EXISTS ${indexName} ON ${this.table} (handled_at);`,
    ]
    this.createTableSql = this.createStatements.join('\n')
  }

  async runOnce(ids: readonly string[], work: (tx: C, fresh: readonly string[]) => Promise<void>): Promise<readonly string[]> {
    await this.ensureTable()
    return this.withClient(async (client, broken) => {
      await client.query('BEGIN').catch((err: unknown) => {
        broken(err)
        throw err
      })
      try {
        // One statement for one id or a batch's; unnest keeps the array's (offset) order, so two
        // transactions inserting overlapping batches take their row locks in the same order.
        const inserted = await client.query(
          `INSERT INTO ${this.table} (id) SELECT unnest($1::text[]) ON CONFLICT (id) DO NOTHING RETURNING id`,
          [[...ids]],
        )
        const fresh = inserted.rows.map((r) => String(r.id))
        if (fresh.length === 0) {
          await client.query('ROLLBACK')
          return fresh
        }
        await work(client, fresh)
        const done = await client.query('COMMIT')
        // A COMMIT of a transaction in which a statement failed (the handler caught the error and
        // returned) rolls back and still succeeds, tagged ROLLBACK: nothing was recorded.
        if (done.command !== undefined && done.command !== 'COMMIT') {
          throw new Error('the transaction was rolled back at COMMIT: a statement in it had failed (did the handler catch a query error?)')
        }
        return fresh
      } catch (err) {
        // Never back to the pool mid-transaction. A ROLLBACK that fails leaves the connection in
        // doubt: closed at release rather than reused (the server rolls back a transaction whose
        // connection is gone).
        await client.query('ROLLBACK').catch(broken)
        throw err
      }
    })
  }

  /**
   * Deletes the ids handled more than `olderThanMs` ago; resolves with how many. A message whose id
   * is gone runs the handler again if it is pushed again, so keep ids longer than any redelivery can
   * come: past the group's retries (maxDeliveries × maxDelayMs), and past the topic's retention
   * (7 days by default) if you replay with seek. Run it on a timer; the handled_at index keeps it cheap.
   */
  async prune({ olderThanMs }: { olderThanMs: number }): Promise<number> {
    if (!(Number.isFinite(olderThanMs) && olderThanMs >= 0))
      throw new RangeError(`olderThanMs must be a finite number ≥ 0, got ${olderThanMs}`)
    await this.ensureTable()
    return this.withClient(async (client) => {
      const deleted = await client.query(
        `DELETE FROM ${this.table} WHERE handled_at < now() - $1::double precision * interval '1 millisecond'`,
        [olderThanMs],
      )
      return deleted.rowCount ?? 0
    })
  }

  /**
   * A client from the pool for `use`, released after it; closed instead when its connection failed
   * or `use` called `broken` (the connection's state is unknown).
   */
  private async withClient<R>(use: (client: C, broken: (err: unknown) => void) => Promise<R>): Promise<R> {
    const client = await this.pool.connect()
    let failure: Error | undefined
    const broken = (err: unknown) => {
      failure ??= err instanceof Error ? err : new Error(String(err))
    }
    client.on?.('error', broken)
    try {
      return await use(client, broken)
    } finally {
      client.removeListener?.('error', broken)
      client.release(failure)
    }
  }

  private ensureTable(): Promise<void> {
    if (!this.createTable) return Promise.resolve()
    if (this.ready === undefined) {
      const ready = this.create()
      ready.catch(() => {
        if (this.ready === ready) this.ready = undefined
      })
      this.ready = ready
    }
    return this.ready
  }

  private async create(): Promise<void> {
    await this.withClient(async (client) => {
      // Looked up first: CREATE INDEX IF NOT EXISTS takes its SHARE lock on the table before it
      // finds the index, so it would wait for every handler transaction open in other processes,
      // and hold up their new INSERTs behind it meanwhile.
      const found = await client.query('SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AS present', [
        this.table,
        this.index,
      ])
      if (found.rows[0]?.present === true) return
      for (const statement of this.createStatements) {
        try {
          await client.query(statement)
        } catch (err) {
          // Two processes creating it at once: IF NOT EXISTS checks before it inserts, so the loser
          // can fail on the catalog's unique index (23505), or find the relation (42P07) or the
          // table's row type (42710, "type ... already exists") made meanwhile.
          const code = typeof err === 'object' && err !== null && 'code' in err ? err.code : undefined
          if (code !== '23505' && code !== '42P07' && code !== '42710') throw err
        }
      }
    })
  }
}

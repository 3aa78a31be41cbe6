/**
 * The database handle: one pg pool shared by the Prisma client (through @prisma/adapter-pg) and the
 * few raw statements Prisma cannot express (row locks, bulk inserts from arrays).
 *
 * The shape of src/store: one file per aggregate (topics, messages, groups, consumption, deliveries,
 * consumer health, outbox, membership), each a module of free functions, one query per function,
 * named for what it does (findGroupByName, insertAttempts, ...). A function's first parameter is
 * the executor it runs on, so the caller picks the connection and any function can join a caller's
 * transaction by being handed that transaction instead of the pool:
 * - `Queryable` for raw SQL: `db.pool` (a statement of its own), or the client `inTransaction` gives.
 * - `PrismaExecutor` for Prisma: `db.prisma`, or the client of a `db.prisma.$transaction(async (tx) => ...)`.
 * - A function that is a transaction itself (several statements that commit together, or a
 *   statement on a client of its own) takes what opens one: the `Database` (a pool transaction) or
 *   the `Prisma` client (a Prisma transaction). Its doc comment says so.
 * Why free functions and not classes over the handle: the repositories hold no state but the
 * handle, and a class would bind every method to it, which is exactly what stops a call from running
 * on a transaction's client instead; services and the dispatcher keep the `Database` and pass what
 * each call needs (graphile-worker's "dependencies passed in, no module globals"). The one stateful
 * object, a member's own session with its advisory locks and LISTEN (MemberSession in
 * membership.ts), stays a class.
 */
import pg from 'pg'
import { PrismaPg } from '@prisma/adapter-pg'
import { PrismaClient, type Prisma as PrismaNamespace } from '../generated/prisma/client.ts'

/**
 * The pools' type parsers: BIGINT columns (offsets) arrive as JS numbers, as offsets stay far below
 * 2^53 (a partition written at 1 M messages/s would need 285 years to get there). Given to each
 * pool, not set on pg's global table, which would change every other pg user in the process too.
 */
export const pgTypes: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === pg.types.builtins.INT8 && format !== 'binary'
      ? Number
      : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig['getTypeParser'],
}

export type Prisma = InstanceType<typeof PrismaClient>

/** What a Prisma query runs on: the client, or the client of an interactive transaction (`$transaction(async (tx) => ...)`). */
export type PrismaExecutor = Prisma | PrismaNamespace.TransactionClient

/** What a raw statement runs on: the pool (a statement of its own) or a client inside a transaction (see inTransaction). */
export interface Queryable {
  /** `text`, or a named statement (prepared once per connection: the hot statements skip PostgreSQL's parse and plan). */
  query<R extends object = Record<string, unknown>>(
    text: string | { name: string; text: string; values?: unknown[] },
    values?: unknown[],
  ): Promise<{ rows: R[]; rowCount: number | null }>
}

export interface Database {
  prisma: Prisma
  pool: pg.Pool
  close(): Promise<void>
}

/** Opens a pool of `maxConnections` to `url` and a Prisma client over it. */
export function openDatabase(url: string, maxConnections: number): Database {
  const pool = new pg.Pool({
    connectionString: url,
    max: maxConnections,
    // A stuck database must not hang requests forever: fail the checkout and answer 503.
    connectionTimeoutMillis: 10_000,
    idleTimeoutMillis: 30_000,
    application_name: 'hookq',
    types: pgTypes,
  })
  // An idle client whose connection dies (server restart) emits 'error' on the pool; without a
  // listener that would crash the process. The pool drops the client and opens a new one on demand.
  pool.on('error', () => {})
  // Likewise a checked-out client whose socket breaks mid-query: its query fails (and the caller
  // answers 503), but the 'error' event itself must not become an uncaught exception.
  pool.on('connect', (client) => {
    client.on('error', () => {})
  })
  const prisma = new PrismaClient({ adapter: new PrismaPg(pool) })
  let closed = false
  return {
    prisma,
    pool,
    async close() {
      if (closed) return
      closed = true
      await prisma.$disconnect()
      if (!pool.ending) await pool.end()
    },
  }
}

/**
 * Runs `fn` in a transaction on one pooled client: COMMIT when it resolves, ROLLBACK when it
 * throws. A client whose ROLLBACK fails has a broken connection and is destroyed, not reused.
 */
export async function inTransaction<T>(db: Database, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await db.pool.connect()
  let broken = false
  try {
    await client.query('BEGIN')
    const result = await fn(client)
    await client.query('COMMIT')
    return result
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {
      broken = true
    })
    throw err
  } finally {
    client.release(broken)
  }
}

/**
 * Whether PostgreSQL's autovacuum is off (the server's setting, or the statistics it needs): then
 * nothing reclaims the rows retention deletes, and the database grows with traffic however short
 * the retentions (measured: +0.65 MB/s at 1,000 msg/s with 60 s retentions).
 */
export async function autovacuumOff(q: Queryable): Promise<boolean> {
  const res = await q.query<{ name: string; setting: string }>(
    `SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')`,
  )
  return res.rows.some((r) => r.setting === 'off')
}

/**
 * PostgreSQL settings that void the promise that a 2xx means durably committed: fsync=off (a
 * crash can lose or corrupt committed data) and synchronous_commit=off (a crash loses the last
 * commits). Returns a description of each one found, empty when the server is safe.
 */
export async function durabilityWarnings(q: Queryable): Promise<string[]> {
  const res = await q.query<{ name: string; setting: string }>(
    `SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')`,
  )
  const warnings: string[] = []
  for (const { name, setting } of res.rows) {
    if (setting === 'off') warnings.push(`${name}=off`)
  }
  return warnings
}

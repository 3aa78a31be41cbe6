/**
 * The database handle: one pg pool shared by the Prisma client (through @prisma/adapter-pg) and the
 * few raw statements Prisma cannot express (row locks, bulk inserts from arrays).
 */
import pg from 'pg'
import { PrismaPg } from '@prisma/adapter-pg'
import { PrismaClient } from '../generated/prisma/client.ts'

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
 * PostgreSQL settings that void the promise that a 2xx means durably committed: fsync=off (a
 * crash can lose or corrupt committed data) and synchronous_commit=off (a crash loses the last
 * commits). Returns a description of each one found, empty when the server is safe.
 */
export async function durabilityWarnings(db: Database): Promise<string[]> {
  const res = await db.pool.query<{ name: string; setting: string }>(
    `SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')`,
  )
  const warnings: string[] = []
  for (const { name, setting } of res.rows) {
    if (setting === 'off') warnings.push(`${name}=off`)
  }
  return warnings
}

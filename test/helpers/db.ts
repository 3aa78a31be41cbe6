/**
 * A database per test file. With DATABASE_URL (a PostgreSQL server), each call clones a migrated
 * template database, which takes milliseconds; the template is built once per migrations content
 * and reused by later runs. Without it, each call starts an in-memory embedded PGlite and migrates it.
 */
import { createHash, randomBytes } from 'node:crypto'
import pg from 'pg'
import { startEmbedded } from '../../src/store/embedded.ts'
import { applyMigrations, MIGRATIONS_DIR } from '../../src/store/migrate.ts'
import { readMigrations } from '../../src/store/schema-engine.ts'

/** What tests need from tap's `t`. */
export interface TeardownHost {
  teardown(fn: () => unknown): void
}

/** A database for one test file: connect to `url` with at most `maxConnections` connections. */
export interface TestDatabase {
  url: string
  maxConnections: number
}

/** The PostgreSQL server tests run against, or undefined when they use the embedded database. */
export const databaseServerUrl: string | undefined = process.env.DATABASE_URL?.trim() || undefined

/**
 * Skip reason for tests that need a real server (several connections, other processes): pass as
 * tap's `skip` option.
 */
export const needsServer: string | false = databaseServerUrl ? false : 'needs a PostgreSQL server (set DATABASE_URL)'

/**
 * A fresh database, dropped (or closed) at the end of the test. Migrated unless `empty` is set.
 * Server databases allow plenty of connections; the embedded one takes one.
 */
export async function testDatabase(t: TeardownHost, opts: { empty?: boolean } = {}): Promise<TestDatabase> {
  if (!databaseServerUrl) {
    const db = await startEmbedded({ dataDir: 'memory' })
    t.teardown(() => db.close())
    if (!opts.empty) await applyMigrations(db.connectionString, { singleConnection: true })
    return { url: db.connectionString, maxConnections: db.maxConnections }
  }
  const source = opts.empty ? 'template0' : await migratedTemplate(databaseServerUrl)
  const name = `hookq_t_${randomBytes(6).toString('hex')}`
  await admin(databaseServerUrl, (c) => c.query(`CREATE DATABASE "${name}" TEMPLATE "${source}"`))
  t.teardown(() => admin(databaseServerUrl, (c) => c.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)))
  // Test files run in parallel, each with a pool or a broker: stay well inside max_connections (100).
  return { url: withDatabase(databaseServerUrl, name), maxConnections: 10 }
}

/** `url` pointing at database `name` on the same server. */
export function withDatabase(url: string, name: string): string {
  const u = new URL(url)
  u.pathname = `/${name}`
  return u.href
}

// Test files run in parallel processes; this key serialises building templates across them.
const TEMPLATE_LOCK_KEY = 0x686b7154 // "hkqT"
let template: Promise<string> | undefined

/**
 * hookq_tpl_<hash of the migrations>: built under the name hookq_tplb_<random> and renamed when
 * complete, so a run killed halfway never leaves a half-migrated template under the real name.
 */
function migratedTemplate(serverUrl: string): Promise<string> {
  template ??= (async () => {
    const migrations = await readMigrations(MIGRATIONS_DIR)
    const hash = createHash('sha256')
    for (const m of migrations.migrationDirectories) {
      hash.update(`${m.path}\0${m.migrationFile.content.value}\0`) // names too: they are recorded
    }
    const name = `hookq_tpl_${hash.digest('hex').slice(0, 16)}`
    await admin(serverUrl, async (c) => {
      await c.query('SELECT pg_advisory_lock($1)', [TEMPLATE_LOCK_KEY])
      const { rowCount } = await c.query('SELECT 1 FROM pg_database WHERE datname = $1', [name])
      if (rowCount) return
      const building = `hookq_tplb_${randomBytes(6).toString('hex')}`
      await c.query(`CREATE DATABASE "${building}"`)
      try {
        await applyMigrations(withDatabase(serverUrl, building))
        await c.query(`ALTER DATABASE "${building}" RENAME TO "${name}"`)
      } catch (err) {
        await c.query(`DROP DATABASE IF EXISTS "${building}" WITH (FORCE)`)
        throw err
      }
    }) // ending the session releases the lock
    return name
  })()
  template.catch(() => (template = undefined))
  return template
}

// CREATE/DROP DATABASE run outside transactions, from the server's maintenance database.
async function admin<T>(serverUrl: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: withDatabase(serverUrl, 'postgres') })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

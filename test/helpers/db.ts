/**
 * A database per test file. With DATABASE_URL (a PostgreSQL server), each call clones a migrated
 * template database, which takes milliseconds; the template is built once per migrations content
 * and reused by later runs. Without it, each call starts an in-memory embedded PGlite from a
 * migrated cluster, likewise built once per PGlite version and migrations content (migratedCluster),
 * or, in a group of files, takes one an earlier file of the group used, emptied (embedded-pool.ts).
 *
 * A server database is dropped at the end of the test that asked for it, unless that test failed:
 * then it is kept, as pg-boss keeps a failed test's schema, and its name and a psql command to
 * open it go to stderr. Kept databases (and any a killed run left) are dropped by the first test
 * process that starts more than KEEP_HOURS after them: their names carry their creation time
 * (hookq_t_<UTC yyyymmddhhmmss>_<random>), so no run ever drops a database of a run still going,
 * its own or another checkout's on the same server.
 */
import { createHash, randomBytes } from 'node:crypto'
import pg from 'pg'
import { keptCluster, startEmbedded } from '../../src/store/embedded.ts'
import { applyMigrations, MIGRATIONS_DIR } from '../../src/store/migrate.ts'
import { readMigrations } from '../../src/store/schema-engine.ts'
import { recordPristine, release, takeIdle } from './embedded-pool.ts'
import { inGroup } from './tap.ts'
import { waitUntil } from './wait.ts'

/** What tests need from tap's `t`. */
export interface TeardownHost {
  teardown(fn: () => unknown): void
  /** tap's: false once the test has failed; a failed test's database is kept. */
  passing?(): boolean
  /** tap's full name of the test, recorded on a kept database. */
  fullname?: string
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
 * A fresh database, dropped (or closed) at the end of the test `t`, or kept if `t` failed (server
 * databases only: the embedded one lives in memory). Migrated unless `empty` is set. Server
 * databases allow plenty of connections; the embedded one takes one.
 */
export async function testDatabase(t: TeardownHost, opts: { empty?: boolean } = {}): Promise<TestDatabase> {
  if (!databaseServerUrl) {
    if (opts.empty) {
      const db = await startEmbedded({ dataDir: 'memory' })
      t.teardown(() => db.close())
      return { url: db.connectionString, maxConnections: db.maxConnections }
    }
    const db = takeIdle() ?? (await recordPristine(await startEmbedded({ dataDir: 'memory', cluster: await migratedCluster() })))
    // In a group, the next file gets it emptied (test/helpers/embedded-pool.ts), unless this test failed.
    t.teardown(() => release(db, inGroup() && t.passing?.() !== false))
    return { url: db.connectionString, maxConnections: db.maxConnections }
  }
  await pruneKept(databaseServerUrl)
  const source = opts.empty ? 'template0' : await migratedTemplate(databaseServerUrl)
  const name = `${TEST_PREFIX}${stamp(new Date())}_${randomBytes(6).toString('hex')}`
  await admin(databaseServerUrl, (c) => c.query(`CREATE DATABASE "${name}" TEMPLATE "${source}"`))
  undropped.add(name)
  // Teardowns run last-registered first: the broker or pool using this database has closed by now.
  t.teardown(async () => {
    undropped.delete(name)
    // tap's full name is `<file> > TAP > <subtest> > ...`; the root test's name says nothing.
    if (t.passing?.() === false) return keep(databaseServerUrl, name, t.fullname?.replace(' > TAP', ''))
    await admin(databaseServerUrl, async (c) => {
      await sessionsGone(c, name)
      await c.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
    })
  })
  // Test files run in parallel, each with a pool or a broker: stay well inside max_connections (100).
  return { url: withDatabase(databaseServerUrl, name), maxConnections: 10 }
}

/** A kept database is dropped by the first test process that starts this long after it was created. */
export const KEEP_HOURS = 24
const TEST_PREFIX = 'hookq_t_'
const TEST_NAME = /^hookq_t_(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})_[0-9a-f]{12}$/

/** `date` as yyyymmddhhmmss, UTC. */
function stamp(date: Date): string {
  return date.toISOString().replace(/\D/g, '').slice(0, 14)
}

/** When a test database was created, from its name; undefined for any other name. */
export function createdAt(name: string): Date | undefined {
  const m = TEST_NAME.exec(name)
  if (!m) return undefined
  const [, y, mo, d, h, mi, s] = m.map(Number) as number[]
  return new Date(Date.UTC(y!, mo! - 1, d!, h!, mi!, s!))
}

// Databases created by this process and not yet dropped or kept: reported if the process ends first.
const undropped = new Set<string>()
process.once('exit', () => {
  for (const name of undropped) {
    process.stderr.write(`# test database ${name} was not dropped: the process ended before its test did (dropped after ${KEEP_HOURS} h)\n`)
  }
})

/** Leaves a failed test's database in place and says where it is. */
async function keep(serverUrl: string, name: string, test: string | undefined): Promise<void> {
  const why = `kept: ${test ?? 'a test'} failed at ${new Date().toISOString()}`
  // The comment shows in psql's \l+; a failure to write it changes nothing else.
  await admin(serverUrl, (c) => c.query(`COMMENT ON DATABASE "${name}" IS '${why.replaceAll("'", "''")}'`)).catch(() => {})
  const open = new URL(withDatabase(serverUrl, name))
  open.password = '' // not into logs; psql takes it from PGPASSWORD or ~/.pgpass
  process.stderr.write(
    `# ${test ?? 'a test'} failed: its database is kept for inspection\n` +
      `#   psql '${open.href}'\n` +
      `#   dropped by the first test run ${KEEP_HOURS} h after its creation (or now: DROP DATABASE "${name}")\n`,
  )
}

let pruned: Promise<void> | undefined

/** Once per process: drops test databases created more than KEEP_HOURS ago (kept, or left by a killed run). */
function pruneKept(serverUrl: string): Promise<void> {
  pruned ??= admin(serverUrl, async (c) => {
    const { rows } = await c.query<{ datname: string }>(`SELECT datname FROM pg_database WHERE datname LIKE 'hookq\\_t\\_%'`)
    const before = Date.now() - KEEP_HOURS * 3_600_000
    for (const { datname } of rows) {
      const at = createdAt(datname)
      if (!at || at.getTime() >= before) continue
      // Another process may be dropping it too: whichever comes second finds nothing to do.
      await c.query(`DROP DATABASE IF EXISTS "${datname}" WITH (FORCE)`).catch(() => {})
    }
  }).catch(() => {}) // best effort: a test never fails for an old database it could not drop
  return pruned
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
    const name = `hookq_tpl_${await migrationsHash()}`
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

/** The hash of the migrations (their names too: they are recorded), hex. */
async function migrationsHash(): Promise<string> {
  const migrations = await readMigrations(MIGRATIONS_DIR)
  const hash = createHash('sha256')
  for (const m of migrations.migrationDirectories) hash.update(`${m.path}\0${m.migrationFile.content.value}\0`)
  return hash.digest('hex').slice(0, 16)
}

let migrated: Promise<Blob> | undefined

/**
 * The embedded counterpart of the template: a migrated cluster, kept as a tar under
 * node_modules/.cache/hookq per PGlite version and migrations content, which every later embedded
 * test database starts from. Migrating each one cost 0.5-0.7 s of CPU, and loading the schema
 * engine's WebAssembly to do so ~2 s more in each test process.
 */
export function migratedCluster(): Promise<Blob> {
  migrated ??= (async () =>
    keptCluster(`-migrated-${await migrationsHash()}`, async () => {
      const db = await startEmbedded({ dataDir: 'memory' })
      try {
        await applyMigrations(db.connectionString, { singleConnection: true })
        return await db.dump()
      } finally {
        await db.close()
      }
    }))()
  migrated.catch(() => (migrated = undefined))
  return migrated
}

/**
 * Waits, up to a bound, for the sessions of a database to end before it is dropped: pg-pool's
 * end() resolves once its clients are told to end, before their sockets close, and a forced drop
 * that kills one of them mid-close makes its client throw (57P01) in the test process. Sessions
 * that outlive the bound (a process still connected) are left to the forced drop, as before.
 */
async function sessionsGone(c: pg.Client, name: string): Promise<void> {
  const count = async () =>
    (await c.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1', [name])).rows[0]!.n
  await waitUntil(async () => (await count()) === 0, 5000, `the sessions of ${name} to end`).catch(() => {})
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

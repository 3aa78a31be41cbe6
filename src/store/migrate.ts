/**
 * Migrations at start-up: the files under prisma/migrations, applied by Prisma's own schema engine
 * (as WebAssembly, see schema-engine.ts) and recorded in `_prisma_migrations` exactly as
 * `prisma migrate deploy` records them, so the stock CLI keeps working on the same database.
 */
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { engineAdapterFactory, NO_FILTERS, readMigrations, withSchemaEngine } from './schema-engine.ts'

/** prisma/migrations of this checkout, found from this file rather than from the working directory. */
export const MIGRATIONS_DIR = fileURLToPath(new URL('../../prisma/migrations', import.meta.url))

/**
 * The session advisory lock applyMigrations holds around the engine. The engine also takes Prisma's
 * lock (72707369), but on whichever pooled connection the adapter hands it; ours is on a connection
 * we own for the whole call. It must differ from Prisma's: holding that one here would block the
 * engine, which waits for it without a timeout (observed: over 10 minutes).
 */
export const MIGRATE_LOCK_KEY = 0x686b714d // "hkqM"

/** Options of applyMigrations. */
export interface ApplyMigrationsOptions {
  /** Engine log lines and the names of applied migrations. */
  log?: (msg: string) => void
  /**
   * The server takes one connection at a time (the embedded PGlite server): skip the advisory lock,
   * which would need a second connection. Only one process opens an embedded data directory
   * (startEmbedded's lock file sees to that), so there is no one to serialise with.
   */
  singleConnection?: boolean
  /** Defaults to MIGRATIONS_DIR; tests point it elsewhere. */
  migrationsDir?: string
}

/**
 * Applies the migrations not yet recorded in `_prisma_migrations` and returns their names (empty
 * when the database was up to date). Safe when several processes start at once on one database:
 * they take turns on a session advisory lock and the later ones find nothing to do.
 */
export async function applyMigrations(connectionString: string, opts: ApplyMigrationsOptions = {}): Promise<{ applied: string[] }> {
  const log = opts.log ?? (() => {})
  const migrationsDir = opts.migrationsDir ?? MIGRATIONS_DIR
  const runEngine = async () => {
    // The engine runs one statement at a time; one connection also suits the embedded server.
    const factory = engineAdapterFactory({ connectionString, maxConnections: 1 })
    const migrations = await readMigrations(migrationsDir)
    const out = await withSchemaEngine(factory, { log }, (engine) =>
      engine.applyMigrations({ migrationsList: migrations, filters: NO_FILTERS }),
    )
    for (const name of out.appliedMigrationNames) log(`applied migration ${name}`)
    return { applied: out.appliedMigrationNames }
  }
  // Nothing to apply (the usual start) skips the engine, whose WebAssembly costs ~70 MB and a second to load.
  if (opts.singleConnection) {
    // One connection at a time: the check's is closed before the engine opens one.
    const done = await withClient(connectionString, (c) => nothingPending((sql) => c.query(sql), migrationsDir))
    return done ? { applied: [] } : runEngine()
  }

  const lock = new pg.Client({ connectionString, application_name: 'hookq-migrate-lock' })
  lock.on('error', () => {}) // a dropped lock connection surfaces as a failed query below
  await lock.connect()
  try {
    await lock.query('SELECT pg_advisory_lock($1)', [MIGRATE_LOCK_KEY])
    if (await nothingPending((sql) => lock.query(sql), migrationsDir)) return { applied: [] }
    return await runEngine()
  } finally {
    // Ending the session releases the lock even if the unlock itself fails.
    await lock.query('SELECT pg_advisory_unlock($1)', [MIGRATE_LOCK_KEY]).catch(() => {})
    await lock.end().catch(() => {})
  }
}

/**
 * Whether every migration is recorded as finished. First it refuses a connection whose search_path
 * does not lead to public: the engine would create the tables there while Prisma's client and the
 * raw SQL look in public.
 */
async function nothingPending(query: QueryFn, migrationsDir: string): Promise<boolean> {
  const { rows } = await query('SELECT current_schema() AS schema')
  const schema = (rows[0] as { schema: string | null } | undefined)?.schema ?? null
  if (schema !== 'public') {
    throw new Error(
      `this connection's search_path puts new tables in ${schema === null ? 'no schema' : `schema "${schema}"`}; ` +
        'hookq keeps its tables in public: reset the search_path of this role or database (ALTER ROLE … SET search_path = public)',
    )
  }
  return (await pendingMigrations(query, migrationsDir)).length === 0
}

/** Runs `fn` on a connection of its own, closed afterwards. */
async function withClient<T>(connectionString: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString, application_name: 'hookq-migrate-check' })
  client.on('error', () => {})
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end().catch(() => {})
  }
}

/** Runs one SQL statement; `(sql) => pool.query(sql)` for a pg Pool or Client. */
export type QueryFn = (sql: string) => Promise<{ rows: unknown[] }>

/**
 * Names of the migration directories not recorded as finished in `_prisma_migrations` (all of them
 * when the table does not exist yet), in the order they would be applied. Backs GET /readyz.
 */
export async function pendingMigrations(query: QueryFn, migrationsDir = MIGRATIONS_DIR): Promise<string[]> {
  const onDisk = (await readMigrations(migrationsDir)).migrationDirectories.map((d) => d.path)
  let finished: Set<string>
  try {
    const { rows } = await query('SELECT migration_name FROM _prisma_migrations WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL')
    finished = new Set(rows.map((r) => (r as { migration_name: string }).migration_name))
  } catch (err) {
    if ((err as { code?: unknown }).code !== '42P01') throw err // 42P01: undefined_table
    finished = new Set()
  }
  return onDisk.filter((name) => !finished.has(name))
}

/**
 * `npm run db:migration -- <name>`: writes the next migration, like `prisma migrate dev --create-only`
 * but with Prisma's schema engine as WebAssembly (the CLI needs a native binary it cannot download
 * offline). The engine replays prisma/migrations on an empty shadow database, diffs the result
 * against prisma/schema.prisma and we write the SQL to prisma/migrations/<UTC timestamp>_<name>/.
 *
 * The shadow database is a temporary database on the server in DATABASE_URL (dropped afterwards) or,
 * without DATABASE_URL, an in-memory embedded PGlite. Nothing else on the server is touched.
 */
import { randomBytes } from 'node:crypto'
import { access, mkdir, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import pg from 'pg'
import { startEmbedded } from '../src/store/embedded.ts'
import { MIGRATIONS_DIR } from '../src/store/migrate.ts'
import {
  engineAdapterFactory,
  type EngineConnection,
  LOCKFILE_CONTENT,
  NO_FILTERS,
  readMigrations,
  withSchemaEngine,
} from '../src/store/schema-engine.ts'

const SCHEMA_PATH = fileURLToPath(new URL('../prisma/schema.prisma', import.meta.url))

/** Prisma's directory prefix: the UTC time as YYYYMMDDHHMMSS. */
function timestamp(now = new Date()): string {
  return now.toISOString().replace(/[-:T]/g, '').slice(0, 14)
}

/** Database connections for the engine, and how to let go of them. */
interface Databases {
  main: EngineConnection
  shadow: () => Promise<EngineConnection>
  close(): Promise<void>
}

// The engine only reads the main database (it looks for the schema); the shadow one gets the replay.
async function serverDatabases(url: string): Promise<Databases> {
  const admin = new pg.Client({ connectionString: url })
  await admin.connect()
  const created = new Set<string>()
  const drop = async (name: string) => {
    created.delete(name)
    await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
  }
  return {
    main: { connectionString: url, maxConnections: 1 },
    async shadow() {
      const name = `hookq_shadow_${randomBytes(6).toString('hex')}`
      await admin.query(`CREATE DATABASE "${name}"`)
      created.add(name)
      const shadowUrl = new URL(url)
      shadowUrl.pathname = `/${name}`
      return { connectionString: shadowUrl.href, maxConnections: 1, onDispose: () => drop(name) }
    },
    async close() {
      try {
        for (const name of [...created]) await drop(name) // left behind if the engine failed early
      } finally {
        await admin.end()
      }
    },
  }
}

// PGlite has one database per instance and one connection per server: one instance each.
async function embeddedDatabases(): Promise<Databases> {
  const instances = [await startEmbedded({ dataDir: 'memory' })]
  const main = instances[0]!
  return {
    main: { connectionString: main.connectionString, maxConnections: 1 },
    async shadow() {
      const shadow = await startEmbedded({ dataDir: 'memory' })
      instances.push(shadow)
      return { connectionString: shadow.connectionString, maxConnections: 1, onDispose: () => shadow.close() }
    },
    async close() {
      await Promise.all(instances.map((db) => db.close()))
    },
  }
}

/** Where the schema and migrations are, and which server (if any) hosts the shadow database. */
export interface NewMigrationOptions {
  name: string
  schemaPath?: string
  migrationsDir?: string
  /** A server to create the temporary shadow database on; undefined: an embedded PGlite. */
  databaseUrl?: string | undefined
  now?: Date
}

/**
 * Writes `<migrationsDir>/<UTC timestamp>_<name>/migration.sql` with what it takes to go from the
 * migrations to the schema (and migration_lock.toml if missing). Returns the file written, or null
 * when the migrations already produce the schema.
 */
export async function writeNextMigration(opts: NewMigrationOptions): Promise<string | null> {
  const schemaPath = opts.schemaPath ?? SCHEMA_PATH
  const migrationsDir = opts.migrationsDir ?? MIGRATIONS_DIR
  const schema = await readFile(schemaPath, 'utf8')
  const migrations = await readMigrations(migrationsDir)
  migrations.lockfile.content ??= LOCKFILE_CONTENT

  const dbs = opts.databaseUrl ? await serverDatabases(opts.databaseUrl) : await embeddedDatabases()
  let sql: string | null
  try {
    const factory = engineAdapterFactory(dbs.main, dbs.shadow)
    const diff = await withSchemaEngine(factory, { schemaFiles: [[schemaPath, schema]] }, (engine) =>
      engine.diff({
        from: { tag: 'migrations', ...migrations },
        to: { tag: 'schemaDatamodel', files: [{ path: schemaPath, content: schema }] },
        script: true,
        exitCode: true, // 2 when there is a difference, 0 when there is none
        filters: NO_FILTERS,
      }),
    )
    sql = diff.exitCode === 2 ? diff.stdout : null
  } finally {
    await dbs.close()
  }
  if (!sql) return null

  const dir = path.join(migrationsDir, `${timestamp(opts.now)}_${opts.name}`)
  await mkdir(dir, { recursive: true })
  const file = path.join(dir, 'migration.sql')
  await writeFile(file, sql, { flag: 'wx' }) // never overwrite a migration
  const lockfile = path.join(migrationsDir, 'migration_lock.toml')
  if (
    !(await access(lockfile).then(
      () => true,
      () => false,
    ))
  )
    await writeFile(lockfile, LOCKFILE_CONTENT)
  return file
}

/** Prisma's normalisation of migration names: lower case, runs of other characters become "_". */
export function migrationSlug(raw: string): string {
  return raw
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .replace(/^_+|_+$/g, '')
}

async function main(): Promise<number> {
  const name = migrationSlug(process.argv[2] ?? '')
  if (!name) {
    console.error('usage: npm run db:migration -- <name>')
    return 2
  }
  const file = await writeNextMigration({ name, databaseUrl: process.env.DATABASE_URL || undefined })
  console.log(file ? `wrote ${path.relative(process.cwd(), file)}` : 'no changes')
  return 0
}

// Run only as a script: tests import writeNextMigration.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) process.exitCode = await main()

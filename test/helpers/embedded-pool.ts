/**
 * Embedded test databases kept for the next file of a group. Without DATABASE_URL each test
 * database is a PGlite started from the kept migrated cluster, ~0.8 s of CPU: in a group
 * (test/helpers/group.ts) a database a file is done with is instead emptied and given to the next
 * file that asks, as database_cleaner and Rails' transactional fixtures do.
 *
 * Emptied means as the migrations left it, checked rather than hoped for: the tables the broker
 * made as it ran (attempt-log partitions, a topic's message chunks) are dropped, the migrations'
 * tables truncated and their rows put back, the sequences set back, the statistics reset; then the
 * schema (relations, columns, constraints, indexes, triggers, functions, settings, roles) must read
 * exactly as it did when the database was new. A test that changed it in any other way (renamed,
 * altered, dropped), or one that failed, leaves a database that is closed, not reused. Session
 * state (prepared statements, locks, LISTENs, settings) is the embedded server's own business: it
 * runs DISCARD ALL before each connection (src/store/embedded.ts).
 */
import pg from 'pg'
import tap from 'tap'
import type { EmbeddedDatabase } from '../../src/store/embedded.ts'

/** How a database looked when it was new: what emptying it must restore and check. */
interface Pristine {
  relations: Set<string>
  rows: Map<string, unknown[]>
  sequences: Map<string, { value: string; called: boolean }>
  schema: string
}

const idle: EmbeddedDatabase[] = []
let pristine: Promise<Pristine> | undefined
let closingAtEnd = false

/** An emptied database a file before this one was done with, if there is one. */
export function takeIdle(): EmbeddedDatabase | undefined {
  return idle.pop()
}

/**
 * Called once a new database has started, before anything used it: its state then is what every
 * later emptying restores (all databases of a process start from the same cluster). Returns `db`.
 */
export async function recordPristine(db: EmbeddedDatabase): Promise<EmbeddedDatabase> {
  pristine ??= withClient(db, readPristine)
  await pristine
  return db
}

/**
 * The end of a file's use of `db`: emptied and kept for the next file, or closed if it cannot be
 * brought back to new (or emptying it failed: a broker of the file still connected, say).
 */
export async function release(db: EmbeddedDatabase, reusable: boolean): Promise<void> {
  const clean = reusable && pristine !== undefined && (await withClient(db, empty).catch(() => false))
  if (!clean) return db.close()
  idle.push(db)
  if (!closingAtEnd) {
    closingAtEnd = true
    // The idle databases' servers would keep the process alive: they close when tap's root test ends.
    tap.teardown(() => Promise.all(idle.splice(0).map((d) => d.close())))
  }
}

async function withClient<T>(db: EmbeddedDatabase, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: db.connectionString })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

const TABLES = `SELECT c.relname AS name, c.relispartition AS part FROM pg_class c
  WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') ORDER BY c.relname`
const SEQUENCES = `SELECT c.relname AS name FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'`

// Everything a test could change that the next file's broker or assertions would see, as text.
const SCHEMA = `SELECT md5(string_agg(x, E'\\n' ORDER BY x)) AS schema FROM (
  SELECT format('rel %s %s %s', c.relname, c.relkind, pg_get_expr(c.relpartbound, c.oid)) AS x
    FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('col %s.%s %s %s %s', a.attrelid::regclass, a.attname, format_type(a.atttypid, a.atttypmod),
      a.attnotnull, pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL SELECT format('con %s %s', conrelid::regclass, pg_get_constraintdef(oid)) FROM pg_constraint
    WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT format('idx %s', pg_get_indexdef(indexrelid)) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('trg %s', pg_get_triggerdef(oid)) FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT format('fn %s', pg_get_functiondef(p.oid)) FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace AND p.prokind IN ('f', 'p')
  UNION ALL SELECT format('set %s %s %s', setdatabase, setrole, setconfig) FROM pg_db_role_setting
  -- A session's temporary schemas come with its first temporary table and stay, empty, for the next.
  UNION ALL SELECT format('ns %s', nspname) FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%temp\\_%'
  UNION ALL SELECT format('role %s %s', rolname, rolconfig) FROM pg_roles
  UNION ALL SELECT format('ext %s %s', extname, extversion) FROM pg_extension
) s`

async function readPristine(c: pg.Client): Promise<Pristine> {
  const tables = (await c.query<{ name: string }>(TABLES)).rows
  const rows = new Map<string, unknown[]>()
  for (const { name } of tables) {
    const { rows: found } = await c.query<{ row: unknown }>(`SELECT to_jsonb(t) AS row FROM "${name}" t`)
    if (found.length > 0)
      rows.set(
        name,
        found.map((r) => r.row),
      )
  }
  const sequences = new Map<string, { value: string; called: boolean }>()
  for (const { name } of (await c.query<{ name: string }>(SEQUENCES)).rows) {
    const { rows: s } = await c.query<{ value: string; called: boolean }>(
      `SELECT last_value::text AS value, is_called AS called FROM "${name}"`,
    )
    sequences.set(name, s[0]!)
  }
  const { rows: schema } = await c.query<{ schema: string }>(SCHEMA)
  return { relations: new Set(tables.map((t) => t.name)), rows, sequences, schema: schema[0]!.schema }
}

/** Brings the database back to new; false if it cannot be. */
async function empty(c: pg.Client): Promise<boolean> {
  const was = await pristine!
  await c.query('BEGIN')
  try {
    const tables = (await c.query<{ name: string; part: boolean }>(TABLES)).rows
    // Made by the broker as it ran. IF EXISTS: a partition of a table it made went with that table.
    for (const t of tables.filter((t) => !was.relations.has(t.name))) await c.query(`DROP TABLE IF EXISTS "${t.name}" CASCADE`)
    if ((await c.query<{ schema: string }>(SCHEMA)).rows[0]!.schema !== was.schema) {
      await c.query('ROLLBACK')
      return false
    }
    const roots = tables.filter((t) => was.relations.has(t.name) && !t.part).map((t) => `"${t.name}"`)
    await c.query(`TRUNCATE ${roots.join(', ')} RESTART IDENTITY CASCADE`)
    for (const [name, rows] of was.rows) {
      await c.query(`INSERT INTO "${name}" SELECT * FROM jsonb_populate_recordset(NULL::"${name}", $1::jsonb)`, [JSON.stringify(rows)])
    }
    for (const [name, s] of was.sequences) await c.query('SELECT setval($1::regclass, $2::bigint, $3)', [`"${name}"`, s.value, s.called])
    await c.query('COMMIT')
  } catch (err) {
    await c.query('ROLLBACK').catch(() => {})
    throw err
  }
  // Outside the transaction: counters a test reads (dead rows, scans) start from zero again.
  await c.query('SELECT pg_stat_reset()')
  return true
}

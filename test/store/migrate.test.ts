import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import t from '../helpers/tap.ts'
import { writeNextMigration } from '../../scripts/new-migration.ts'
import { legacyBound, maintainMessageChunks, maintainTopicChunks } from '../../src/store/message-chunks.ts'
import { applyMigrations, MIGRATE_LOCK_KEY, MIGRATIONS_DIR, pendingMigrations } from '../../src/store/migrate.ts'
import { partitionStarts, tableSizes } from '../../src/store/storage.ts'
import { readMigrations } from '../../src/store/schema-engine.ts'
import { databaseServerUrl, needsServer, testDatabase, type TeardownHost } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

const SCHEMA_PATH = fileURLToPath(new URL('../../prisma/schema.prisma', import.meta.url))
const names = (await readMigrations(MIGRATIONS_DIR)).migrationDirectories.map((d) => d.path)
// On a server the tests run side by side: each migrates a database (and a folder) of its own, and
// waits on PostgreSQL and the schema engine more than on this process. Embedded, one at a time: each
// of their databases is an in-memory PostgreSQL in this process.
t.jobs = databaseServerUrl ? 3 : 1

/** One connection for the duration of `fn`: the embedded database takes only one at a time. */
async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

const recorded = (url: string) =>
  withClient(url, async (c) => (await c.query('SELECT migration_name, finished_at FROM _prisma_migrations')).rows)

async function tempDir(t: TeardownHost): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), 'hookq-migrate-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  return dir
}

t.test('the migrations folder holds the init migration in Prisma layout', async (t) => {
  t.ok(names.length >= 1)
  t.match(names[0], /^\d{14}_init$/)
  t.match(await readFile(path.join(MIGRATIONS_DIR, 'migration_lock.toml'), 'utf8'), /provider = "postgresql"/)
})

/** The columns of each unique index of a table, as pg_get_indexdef writes them. */
const uniqueKeys = (url: string, table: string) =>
  withClient(url, async (c) =>
    (
      await c.query(
        `SELECT substring(pg_get_indexdef(i.indexrelid) FROM '\\((.*)\\)$') AS cols FROM pg_index i WHERE i.indrelid = $1::regclass AND i.indisunique ORDER BY 1`,
        [table],
      )
    ).rows.map((r) => r.cols as string),
  )
const MESSAGE_KEY = 'topic_id, partition, "offset", produced_at'

t.test('applies to an empty database, then has nothing to do', async (t) => {
  const db = await testDatabase(t, { empty: true })
  const singleConnection = db.maxConnections === 1
  t.same(await withClient(db.url, (c) => pendingMigrations((sql) => c.query(sql))), names, 'all pending before')

  t.same(await applyMigrations(db.url, { singleConnection }), { applied: names })
  // The attempt log's time partitions are named for their range (the first for when it was migrated).
  const tables = await withClient(db.url, async (c) =>
    (await c.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).rows
      .map((r) => r.tablename)
      .filter((name) => !/^deliveries_\d+_\d+$/.test(name)),
  )
  // Every table the migrations create and do not drop again, and nothing else but Prisma's bookkeeping.
  const scripts = (await readMigrations(MIGRATIONS_DIR)).migrationDirectories.map((d) => d.migrationFile.content.value)
  const created = scripts.flatMap((sql) => [...sql.matchAll(/CREATE TABLE "([^"]+)"/g)].map((m) => m[1]!))
  const dropped = new Set(scripts.flatMap((sql) => [...sql.matchAll(/DROP TABLE "([^"]+)"/g)].map((m) => m[1]!)))
  t.same(tables, ['_prisma_migrations', ...new Set(created.filter((name) => !dropped.has(name)))].sort())
  t.ok(['messages', 'topic_partitions', 'topics', 'consumer_groups', 'deliveries'].every((x) => tables.includes(x)))
  t.same(await uniqueKeys(db.url, 'messages_default'), [MESSAGE_KEY], "messages_default has the parent's key")
  const rows = await recorded(db.url)
  t.same(rows.map((r) => r.migration_name).sort(), names)
  t.ok(
    rows.every((r) => r.finished_at instanceof Date),
    'recorded as finished',
  )
  t.same(await withClient(db.url, (c) => pendingMigrations((sql) => c.query(sql))), [], 'none pending after')

  t.same(await applyMigrations(db.url, { singleConnection }), { applied: [] }, 'second run is a no-op')
  t.equal((await recorded(db.url)).length, names.length)
})

t.test('partitioning the attempt log keeps its rows: the old table is its first partition', async (t) => {
  const db = await testDatabase(t, { empty: true })
  const singleConnection = db.maxConnections === 1
  const dir = await tempDir(t)
  const partitioning = names.find((n) => n.endsWith('_attempt_log_partitions'))!
  await cp(MIGRATIONS_DIR, dir, { recursive: true })
  for (const n of names.filter((n) => n >= partitioning)) await rm(path.join(dir, n), { recursive: true })
  await applyMigrations(db.url, { singleConnection, migrationsDir: dir })
  await withClient(db.url, (c) =>
    c.query(`INSERT INTO deliveries (id, group_id, topic_id, partition, "offset", attempt, started_at, outcome)
             VALUES ('d1', 1, 1, 0, 7, 2, now() - interval '1 minute', 'failed')`),
  )
  await applyMigrations(db.url, { singleConnection })
  const rows = await withClient(
    db.url,
    async (c) =>
      (await c.query(`SELECT tableoid::regclass::text AS p, id, attempt, filed_at = '-infinity' AS unfiled FROM deliveries`)).rows,
  )
  t.match(rows, [{ p: /^deliveries_0_\d+$/, id: 'd1', attempt: 2, unfiled: true }], 'in the first partition, not rewritten')
  // A new row goes to the default partition until the broker makes partitions for now.
  await withClient(db.url, (c) =>
    c.query(`INSERT INTO deliveries (id, group_id, topic_id, partition, "offset", attempt, started_at, outcome, filed_at)
             VALUES ('d2', 1, 1, 0, 8, 1, now(), 'acked', now())`),
  )
  t.equal(
    (await withClient(db.url, (c) => c.query(`SELECT tableoid::regclass::text AS p FROM deliveries WHERE id = 'd2'`))).rows[0].p,
    'deliveries_default',
  )
})

t.test('moving idempotency keys to their own table keeps every message and every key', async (t) => {
  const db = await testDatabase(t, { empty: true })
  const singleConnection = db.maxConnections === 1
  const dir = await tempDir(t)
  const moving = names.find((n) => n.endsWith('_idempotency_keys_table'))!
  await cp(MIGRATIONS_DIR, dir, { recursive: true })
  for (const n of names.filter((n) => n >= moving)) await rm(path.join(dir, n), { recursive: true })
  await applyMigrations(db.url, { singleConnection, migrationsDir: dir })
  await withClient(db.url, (c) =>
    c.query(`INSERT INTO messages (topic_id, partition, "offset", value, produced_at, idempotency_key)
             VALUES (1, 0, 0, '"a"', '2026-12-01T00:00:00Z', 'k-a'), (1, 0, 1, '"b"', now(), NULL), (1, 2, 5, '"c"', now(), 'k-c')`),
  )
  await applyMigrations(db.url, { singleConnection })
  const after = await withClient(db.url, async (c) => ({
    messages: (await c.query(`SELECT partition, "offset", value FROM messages ORDER BY partition, "offset"`)).rows,
    keys: (await c.query(`SELECT key, partition, "offset"::int, produced_at FROM idempotency_keys ORDER BY key`)).rows,
    column: (await c.query(`SELECT 1 FROM information_schema.columns WHERE table_name = 'messages' AND column_name = 'idempotency_key'`))
      .rows,
  }))
  t.same(after.messages, [
    { partition: 0, offset: '0', value: '"a"' },
    { partition: 0, offset: '1', value: '"b"' },
    { partition: 2, offset: '5', value: '"c"' },
  ])
  t.match(after.keys, [
    { key: 'k-a', partition: 0, offset: 0, produced_at: new Date('2026-12-01T00:00:00Z') },
    { key: 'k-c', partition: 2, offset: 5 },
  ])
  t.same(after.column, [], 'messages no longer has the column')
})

t.test('partitioning messages into chunks copies nothing: the table is the legacy partition, read and swept as before', async (t) => {
  const db = await testDatabase(t, { empty: true })
  const singleConnection = db.maxConnections === 1
  const dir = await tempDir(t)
  const chunking = names.find((n) => n.endsWith('_message_chunks'))!
  await cp(MIGRATIONS_DIR, dir, { recursive: true })
  for (const n of names.filter((n) => n >= chunking)) await rm(path.join(dir, n), { recursive: true })
  await applyMigrations(db.url, { singleConnection, migrationsDir: dir })
  await withClient(db.url, async (c) => {
    // Many topics: a migration that made each one's tree in its one transaction took 28 locks a topic
    // and ran out of lock table (~720 topics in review; the limit depends on the server's
    // max_locks_per_transaction × max_connections, 1,500 did not reach it here at 64 × 400). Counted
    // below by what the migration creates, which must not grow with the topics. 2,000 of them with
    // gaps (ids 100, 107, ... 14,093): a LIST bound of their ids made pg_class's row too big
    // (ERROR: row is too big, at some 600-1,000 ids), so the upgrade could never succeed.
    await c.query(`INSERT INTO topics (id, name, partitions, retention_ms) VALUES (1, 'a', 1, 60000), (2, 'b', 3, 60000)`)
    await c.query(
      `INSERT INTO topics (id, name, partitions, retention_ms) SELECT 100 + 7 * i, 'many-' || i, 1, 60000 FROM generate_series(0, 1999) i`,
    )
    // Ids handed out past the last topic (topics made and deleted since): the bound is above them too.
    await c.query(`SELECT setval(pg_get_serial_sequence('topics', 'id'), 20000)`)
    // A row of a topic whose row is gone (its messages left behind) stays too: the sweep deletes it.
    await c.query(`INSERT INTO messages (topic_id, partition, "offset", value, produced_at)
                   VALUES (1, 0, 0, '"a"', '2026-12-01T00:00:00Z'), (1, 0, 1, '"b"', now()), (2, 2, 5, '"c"', now()), (9, 0, 0, '"x"', now())`)
  })
  const relfilenode = await withClient(
    db.url,
    async (c) => (await c.query(`SELECT relfilenode FROM pg_class WHERE relname = 'messages'`)).rows[0].relfilenode as number,
  )
  const relations = () =>
    withClient(
      db.url,
      async (c) => (await c.query(`SELECT count(*)::int AS n FROM pg_class WHERE relkind IN ('r', 'p', 'i', 'I')`)).rows[0].n as number,
    )
  const before = await relations()
  await applyMigrations(db.url, { singleConnection })
  const made = (await relations()) - before
  t.ok(
    made <= 7,
    `the migrations made a parent, an index and a default (with theirs and its key: ${made}), whatever the topics; not a tree each`,
  )
  // The parent has no key here (see the migrations); messages_default, made after it, gets one of its own.
  t.same(await uniqueKeys(db.url, 'messages'), [], 'an upgraded parent has no key')
  t.same(await uniqueKeys(db.url, 'messages_default'), [MESSAGE_KEY], 'messages_default has the key a new database’s has')
  t.same(await uniqueKeys(db.url, 'messages_legacy'), ['topic_id, partition, "offset"'], 'messages_legacy keeps its own')
  const pool = new pg.Pool({ connectionString: db.url, max: singleConnection ? 1 : 4 })
  t.teardown(() => pool.end())
  // As reads run: one topic a statement, unnamed (a custom plan prunes to the topic's partition).
  const read = async (topicId: number) =>
    (
      await pool.query(
        `SELECT partition, "offset"::int, value, tableoid::regclass::text AS home FROM messages WHERE topic_id = $1 ORDER BY 1, 2`,
        [topicId],
      )
    ).rows
  const parts = async () =>
    (
      await pool.query(`SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                        WHERE i.inhparent = 'messages'::regclass ORDER BY 1`)
    ).rows.map((r) => r.name)
  t.same(await read(1), [
    { partition: 0, offset: 0, value: '"a"', home: 'messages_legacy' },
    { partition: 0, offset: 1, value: '"b"', home: 'messages_legacy' },
  ])
  t.same(await read(2), [{ partition: 2, offset: 5, value: '"c"', home: 'messages_legacy' }])
  t.same(await read(9), [{ partition: 0, offset: 0, value: '"x"', home: 'messages_legacy' }], "a deleted topic's rows")
  t.same(await parts(), ['messages_default', 'messages_legacy'], 'no tree made by the migration')
  t.equal(
    (await pool.query(`SELECT relfilenode FROM pg_class WHERE relname = 'messages_legacy'`)).rows[0].relfilenode,
    relfilenode,
    'the table itself, not a copy',
  )
  t.equal(await legacyBound(pool), 20001, 'messages_legacy holds every id the sequence handed out, and no later one')
  t.same(await read(14093), [], "the last old topic's reads reach messages_legacy")

  // The storage gauges read it as a part of messages like a topic's tree.
  const sizes = await tableSizes(pool)
  t.ok((sizes.find((x) => x.table === 'messages')?.bytes ?? 0) > 0, 'messages_legacy counted in the size of messages')
  await pool.query(`INSERT INTO topic_partitions (topic_id, partition, next_offset) VALUES (2, 0, 0), (2, 1, 0), (2, 2, 6)`)
  t.match(await partitionStarts(pool, 2), [{ partition: 0 }, { partition: 1 }, { partition: 2, startOffset: 5 }])

  // An old topic's produce still lands in messages_legacy; a new topic gets a tree (made by the broker).
  await pool.query(`INSERT INTO messages (topic_id, partition, "offset", value) VALUES (2, 0, 0, '"new"')`)
  // Its id from the sequence: the first above messages_legacy's range.
  const fresh = (await pool.query(`INSERT INTO topics (name, partitions, retention_ms) VALUES ('fresh', 1, 60000) RETURNING id`)).rows[0]
    .id as number
  t.equal(fresh, 20001)
  await maintainTopicChunks(pool, fresh, { sweepIntervalMs: 60_000, wait: true })
  await pool.query(`INSERT INTO messages (topic_id, partition, "offset", value) VALUES ($1, 0, 0, '"f"')`, [fresh])
  t.match(await read(2), [
    { offset: 0, home: 'messages_legacy' },
    { offset: 5, home: 'messages_legacy' },
  ])
  t.match(await read(fresh), [{ offset: 0, home: /^messages_t20001_\d+_\d+$/ }])
  // A read of one topic plans and scans its tree only (pruned on topic_id).
  const plan = (await pool.query(`EXPLAIN (COSTS OFF) SELECT * FROM messages WHERE topic_id = ${fresh}`)).rows
    .map((r) => r['QUERY PLAN'] as string)
    .join('\n')
  t.notMatch(plan, /messages_legacy|messages_default/, plan)
  t.match(plan, /messages_t20001_/)

  // Retention deletes messages_legacy's rows row by row: past the topic's retention, and a deleted topic's.
  const swept = await maintainMessageChunks(pool, { sweepIntervalMs: 60_000, wait: true })
  t.same(swept.failed, [])
  t.equal(swept.legacyRows, 2)
  t.same(
    (await read(1)).map((r) => r.offset),
    [1],
  )
  t.same(await read(9), [])
  t.equal((await read(2)).length, 2)

  // Once none of its topics is left and it is empty, it goes.
  await pool.query(`DELETE FROM topics WHERE id < $1`, [fresh])
  const last = await maintainMessageChunks(pool, { sweepIntervalMs: 60_000, wait: true })
  t.same(last.failed, [])
  t.equal(last.legacyRows, 3)
  t.ok(last.dropped.includes('messages_legacy'))
  t.match(await parts(), ['messages_default', 'messages_t20001'])
  t.equal((await read(fresh)).length, 1)
})

t.test('concurrent starts on one fresh database apply each migration once', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t, { empty: true })
  const results = await Promise.all([1, 2, 3].map(() => applyMigrations(db.url)))
  t.same(results.flatMap((r) => r.applied).sort(), names, 'one starter applied them, the others found nothing')
  t.equal((await recorded(db.url)).length, names.length)
})

t.test('a second starter waits for the one holding the migration lock', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t, { empty: true })
  await withClient(db.url, async (holder) => {
    await holder.query('SELECT pg_advisory_lock($1)', [MIGRATE_LOCK_KEY])
    const starting = applyMigrations(db.url)
    await waitUntil(
      async () => {
        const { rowCount } = await holder.query("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted", [
          MIGRATE_LOCK_KEY,
        ])
        return rowCount === 1
      },
      10_000,
      'applyMigrations to queue on the advisory lock',
    )
    t.same(await pendingMigrations((sql) => holder.query(sql)), names, 'nothing applied while the lock is held')
    await holder.query('SELECT pg_advisory_unlock($1)', [MIGRATE_LOCK_KEY])
    t.same(await starting, { applied: names })
  })
})

t.test('scripts run whole: $$ bodies and ";" in literals; pending lists the new one', async (t) => {
  const db = await testDatabase(t)
  const singleConnection = db.maxConnections === 1
  const dir = await tempDir(t)
  await cp(MIGRATIONS_DIR, dir, { recursive: true })
  await mkdir(path.join(dir, '29990101000000_function'))
  await writeFile(
    path.join(dir, '29990101000000_function', 'migration.sql'),
    "CREATE TABLE notes (body TEXT NOT NULL DEFAULT 'a;b');\n" +
      'CREATE FUNCTION one() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$;\n',
  )
  const pending = () => withClient(db.url, (c) => pendingMigrations((sql) => c.query(sql), dir))
  t.same(await pending(), ['29990101000000_function'])
  t.same(await applyMigrations(db.url, { singleConnection, migrationsDir: dir }), { applied: ['29990101000000_function'] })
  t.same(await pending(), [])
  const row = await withClient(db.url, async (c) => {
    await c.query('INSERT INTO notes DEFAULT VALUES')
    return (await c.query('SELECT one() AS one, body FROM notes')).rows[0]
  })
  t.same(row, { one: 1, body: 'a;b' })
})

t.test('a failing migration applies nothing and is recorded as failed', async (t) => {
  const db = await testDatabase(t)
  const singleConnection = db.maxConnections === 1
  const dir = await tempDir(t)
  await cp(MIGRATIONS_DIR, dir, { recursive: true })
  await mkdir(path.join(dir, '29990101000000_broken'))
  await writeFile(
    path.join(dir, '29990101000000_broken', 'migration.sql'),
    'CREATE TABLE half (id INT);\nCREATE TABLE broken (id no_such_type);\n',
  )
  await t.rejects(applyMigrations(db.url, { singleConnection, migrationsDir: dir }), /no_such_type/)
  const half = await withClient(db.url, async (c) => (await c.query("SELECT to_regclass('half') AS t")).rows[0].t)
  t.equal(half, null, 'the statements before the failing one were rolled back')
  t.same(await withClient(db.url, (c) => pendingMigrations((sql) => c.query(sql), dir)), ['29990101000000_broken'])
})

t.test('db:migration writes nothing for an unchanged schema and the diff for a changed one', async (t) => {
  const dir = await tempDir(t)
  const migrationsDir = path.join(dir, 'migrations')
  await cp(MIGRATIONS_DIR, migrationsDir, { recursive: true })
  const schemaPath = path.join(dir, 'schema.prisma')
  const schema = await readFile(SCHEMA_PATH, 'utf8')
  await writeFile(schemaPath, schema)
  const databaseUrl = databaseServerUrl

  t.equal(await writeNextMigration({ name: 'nothing', schemaPath, migrationsDir, databaseUrl }), null)

  await writeFile(schemaPath, schema.replace(/(model Topic \{\n)/, '$1  description String?\n'))
  const file = await writeNextMigration({
    name: 'topic_description',
    schemaPath,
    migrationsDir,
    databaseUrl,
    now: new Date('2999-01-02T03:04:05Z'),
  })
  t.equal(file, path.join(migrationsDir, '29990102030405_topic_description', 'migration.sql'))
  t.match(await readFile(file!, 'utf8'), /ALTER TABLE "topics" ADD COLUMN\s+"description" TEXT/)

  const db = await testDatabase(t, { empty: true })
  const { applied } = await applyMigrations(db.url, { singleConnection: db.maxConnections === 1, migrationsDir })
  t.same(applied, [...names, '29990102030405_topic_description'])
  t.equal(await writeNextMigration({ name: 'again', schemaPath, migrationsDir, databaseUrl }), null, 'in sync again')
})

t.test('a search_path leading away from public is refused before anything is created', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t, { empty: true })
  const name = new URL(db.url).pathname.slice(1)
  await withClient(db.url, async (c) => {
    await c.query('CREATE SCHEMA hq')
    await c.query(`ALTER DATABASE "${name}" SET search_path = hq`)
  })
  await t.rejects(applyMigrations(db.url), /search_path puts new tables in schema "hq"; hookq keeps its tables in public/)
  const tables = await withClient(
    db.url,
    async (c) =>
      (await c.query(`SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema IN ('hq', 'public')`)).rows,
  )
  t.same(tables, [], 'no table created in either schema')
})

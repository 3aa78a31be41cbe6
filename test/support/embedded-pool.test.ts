/**
 * An embedded test database a file of a group is done with (test/helpers/embedded-pool.ts): emptied
 * back to new and given to the next file, or closed when it cannot be (its schema changed, its
 * test failed).
 */
import pg from 'pg'
import { startEmbedded } from '../../src/store/embedded.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { migratedCluster } from '../helpers/db.ts'
import { recordPristine, release, takeIdle } from '../helpers/embedded-pool.ts'
import t from '../helpers/tap.ts'

// testDatabase's cluster, started here by hand so that this file holds the database itself.
const migrated = async () => startEmbedded({ dataDir: 'memory', cluster: await migratedCluster() })
type Db = Awaited<ReturnType<typeof migrated>>

const query = async (db: Db, sql: string) => {
  const c = new pg.Client({ connectionString: db.connectionString })
  await c.connect()
  try {
    return (await c.query(sql)).rows
  } finally {
    await c.end()
  }
}
const tables = async (db: Db) =>
  (await query(db, `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p') ORDER BY 1`)).map(
    (r) => r.relname as string,
  )
const closed = async (db: Db) =>
  query(db, 'SELECT 1').then(
    () => false,
    () => true,
  )

// Databases an earlier file of this group left idle would be taken below instead of this file's.
for (let d = takeIdle(); d; d = takeIdle()) await d.close()

t.test('a database a broker used comes back as new and serves the next file', async (t) => {
  const db = await migrated()
  t.teardown(() => db.close())
  await recordPristine(db)
  const newTables = await tables(db)
  const migrations = await query(db, 'SELECT count(*)::int AS n FROM _prisma_migrations')

  await t.test('a file that uses it', async (t) => {
    const broker = await startBroker(t, {}, { db: { url: db.connectionString, maxConnections: 1 } })
    const { call, produce } = api(broker)
    t.equal((await call('PUT', '/v1/topics/orders', { partitions: 2 })).status, 201)
    t.equal((await produce('orders', [{ value: 'a' }, { value: 'b' }])).status, 201)
  })
  t.not((await tables(db)).join(), newTables.join(), 'the broker made tables as it ran (the topic’s message chunks)')

  await release(db, true)
  t.equal(takeIdle(), db, 'kept for the next file')
  t.same(await tables(db), newTables, 'the tables the broker made are gone')
  t.same(await query(db, 'SELECT count(*)::int AS n FROM topics'), [{ n: 0 }], 'no topic left')
  t.same(await query(db, 'SELECT count(*)::int AS n FROM _prisma_migrations'), migrations, 'the migrations’ own rows are back')

  await t.test('the next file sees a new database', async (t) => {
    const broker = await startBroker(t, {}, { db: { url: db.connectionString, maxConnections: 1 } })
    const { call, sql } = api(broker)
    t.equal((await call('PUT', '/v1/topics/orders', { partitions: 1 })).status, 201, 'the same name is free again')
    // The embedded database serves one connection at a time: the broker's.
    t.same(await sql('SELECT id FROM topics'), [{ id: 1 }], 'ids start over: the sequences are set back')
  })
})

t.test('a database whose schema a test changed, or whose test failed, is closed, not kept', async (t) => {
  const altered = await migrated()
  t.teardown(() => altered.close())
  await recordPristine(altered)
  await query(altered, 'ALTER TABLE topics ADD COLUMN note text')
  await release(altered, true)
  t.equal(takeIdle(), undefined, 'not kept')
  t.ok(await closed(altered), 'closed')

  const failed = await migrated()
  t.teardown(() => failed.close())
  await release(failed, false)
  t.equal(takeIdle(), undefined, 'not kept')
  t.ok(await closed(failed), 'closed')
})

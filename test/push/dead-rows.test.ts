// Where autovacuum does not run, the retention sweep vacuums hookq's tables whose rows the traffic
// deletes or updates (not only those it deletes from itself): group_completions above all, a row per
// completion out of order, deleted by the progress write once the committed offset passes it. A
// table is vacuumed once its dead rows pass autovacuum's threshold (50 + 20% of its rows), read from
// pg_stat_user_tables; with track_counts off (no such counts), at every sweep. The sweeps are run
// directly; nothing waits on time.
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { RetentionSweeper } from '../../src/service/retention.ts'
import { attemptPartitionPlan } from '../../src/store/attempt-partitions.ts'
import { VACUUMED_TABLES } from '../../src/store/vacuum.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const RETENTION_MS = 60_000
const db = await testDatabase(t)
const open = (url = db.url): Promise<Broker> =>
  createBroker(
    loadConfig({
      DATABASE_URL: url,
      HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
      LOG_LEVEL: 'silent',
      HOOKQ_ATTEMPT_RETENTION_MS: String(RETENTION_MS),
    }),
  )
const sweeper = (broker: Broker, vacuum: boolean, errors: unknown[]) =>
  new RetentionSweeper(broker.db, {
    intervalMs: 60_000,
    attemptRetentionMs: RETENTION_MS,
    attemptPartitions: attemptPartitionPlan(RETENTION_MS, 60_000),
    sliceRows: 1000,
    vacuumMessages: vacuum,
    onError: (err) => errors.push(err),
  })

t.test('the completions the committed offset passes are vacuumed by the sweep once past the threshold', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { call, produce, sql, ack, groupStatus } = api(broker)
  // Nothing but the sweep vacuums it, whatever the server's autovacuum setting.
  await sql('ALTER TABLE group_completions SET (autovacuum_enabled = false)')
  const stats = async () =>
    (
      await sql(
        `SELECT n_live_tup::int AS live, n_dead_tup::int AS dead, vacuum_count::int AS vacuums FROM pg_stat_user_tables WHERE relname = 'group_completions'`,
      )
    )[0] as { live: number; dead: number; vacuums: number }

  // Explicit acks: every push stays in flight until acked, so the acks choose the order of completion.
  const receiver = await startReceiver(t, { status: 200 })
  await call('PUT', '/v1/topics/comp', { partitions: 1 })
  await call('PUT', '/v1/groups/comp-g', { topic: 'comp', ackTimeoutMs: 600_000, maxInFlight: 200 })
  await call('POST', '/v1/groups/comp-g/consumers', { url: receiver.url })
  const N = 120
  await produce(
    'comp',
    Array.from({ length: N }, (_, i) => ({ value: i })),
  )
  const pushes = await receiver.waitFor(N)
  const idOf = new Map(pushes.map((p) => [(p.json as { offset: number }).offset, (p.json as { deliveryId: string }).deliveryId]))
  t.equal(idOf.size, N, 'every offset pushed')

  // Offsets 1..119 completed out of order: a row each, live.
  const rest = [...idOf].filter(([offset]) => offset !== 0).map(([, id]) => id)
  t.ok((await ack('comp-g', rest)).every((s) => s === 'acked'))
  await waitUntil(async () => (await stats()).live === N - 1, 15_000, 'the completions counted live')
  const errors: unknown[] = []
  const before = await stats()
  await sweeper(broker, true, errors).sweep()
  t.equal((await stats()).vacuums, before.vacuums, 'no dead rows: not vacuumed')

  // Offset 0 completes: the committed offset passes all of them, and their rows are deleted.
  t.same(await ack('comp-g', [idOf.get(0)!]), ['acked'])
  await waitUntil(async () => (await groupStatus('comp-g')).partitions[0].committedOffset === N, 15_000, 'committed offset at the end')
  t.same(await sql('SELECT count(*)::int AS n FROM group_completions'), [{ n: 0 }], 'no completion row left live')
  await waitUntil(async () => (await stats()).dead >= N - 1, 15_000, 'the deletes counted as dead rows')

  // With autovacuum to do it (vacuumMessages false), the sweep leaves them.
  await sweeper(broker, false, errors).sweep()
  t.equal((await stats()).vacuums, before.vacuums, 'the sweep does not vacuum where autovacuum runs')
  t.ok((await stats()).dead >= N - 1, 'the dead rows stay')

  // Where it does not: 119 dead rows pass 50 + 20% of a table of no live rows.
  await sweeper(broker, true, errors).sweep()
  const after = await stats()
  t.equal(after.vacuums, before.vacuums + 1, 'vacuumed once')
  t.equal(after.dead, 0, 'no dead row left')
  t.same(errors, [])
})

t.test('dead rows below the threshold are left for a later sweep', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { sql } = api(broker)
  await sql('ALTER TABLE consumer_health SET (autovacuum_enabled = false)')
  const stats = async () =>
    (
      await sql(`SELECT n_dead_tup::int AS dead, vacuum_count::int AS vacuums FROM pg_stat_user_tables WHERE relname = 'consumer_health'`)
    )[0] as {
      dead: number
      vacuums: number
    }
  const errors: unknown[] = []
  // A consumer's health buckets, written and deleted as its pushes would (its buckets age out).
  await sql(`INSERT INTO consumer_groups (name, topic) VALUES ('health-g', 'none')`)
  await sql(
    `INSERT INTO consumers (id, group_id, url) SELECT 'health-c', id, 'http://127.0.0.1:1/' FROM consumer_groups WHERE name = 'health-g'`,
  )
  const bucketRows = (n: number, from: number) =>
    sql(
      `INSERT INTO consumer_health (consumer_id, bucket, successes, failures)
       SELECT 'health-c', to_timestamp(0) + (g * interval '10 seconds'), 1, 0 FROM generate_series(${from}, ${from + n - 1}) g`,
    )
  await bucketRows(40, 0)
  await sql(`DELETE FROM consumer_health WHERE consumer_id = 'health-c'`)
  await waitUntil(async () => (await stats()).dead >= 40, 15_000, '40 dead rows counted')
  const before = await stats()
  await sweeper(broker, true, errors).sweep()
  t.equal((await stats()).vacuums, before.vacuums, '40 dead rows: fewer than autovacuum waits for (50 + 20% of none)')
  await bucketRows(40, 100)
  await sql(`DELETE FROM consumer_health WHERE consumer_id = 'health-c'`)
  await waitUntil(async () => (await stats()).dead >= 80, 15_000, '80 dead rows counted')
  await sweeper(broker, true, errors).sweep()
  t.equal((await stats()).vacuums, before.vacuums + 1, '80: vacuumed')
  t.equal((await stats()).dead, 0)
  t.same(errors, [])
})

t.test(
  'with track_counts off (no dead-row counts) the tables written as messages flow are vacuumed at every sweep',
  { skip: needsServer },
  async (t) => {
    const broker = await open(`${db.url}?options=${encodeURIComponent('-c track_counts=off')}`)
    t.teardown(() => broker.close())
    const { sql } = api(broker)
    // A vacuum leaves no count when track_counts is off, but it sets reltuples, which a table never
    // vacuumed nor analyzed has at -1.
    const reltuples = async (name: string) => Number((await sql(`SELECT reltuples FROM pg_class WHERE relname = '${name}'`))[0]!.reltuples)
    t.equal(await reltuples('produce_outbox'), -1, 'the outbox never vacuumed yet')
    const errors: unknown[] = []
    await sweeper(broker, true, errors).sweep()
    t.same(errors, [])
    t.equal(await reltuples('produce_outbox'), 0, 'vacuumed by the sweep')
    t.equal(await reltuples('api_keys'), -1, 'a table the traffic does not write is left alone')
  },
)

t.test("only hookq's own tables are vacuumed: the list is every plain table the migrations make, less those swept by count", async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { sql } = api(broker)
  // Another application's table in the same schema, far past the threshold: left to its owner.
  await sql('CREATE TABLE their_table (id int)')
  await sql('ALTER TABLE their_table SET (autovacuum_enabled = false)')
  await sql('INSERT INTO their_table SELECT generate_series(1, 500)')
  await sql('DELETE FROM their_table')
  await waitUntil(
    async () =>
      ((await sql(`SELECT n_dead_tup::int AS dead FROM pg_stat_user_tables WHERE relname = 'their_table'`))[0] as { dead: number }).dead >=
      500,
    30_000,
    'the dead rows counted',
  )
  const errors: unknown[] = []
  await sweeper(broker, true, errors).sweep()
  t.same(errors, [])
  const theirs = (await sql(`SELECT vacuum_count::int AS vacuums FROM pg_stat_user_tables WHERE relname = 'their_table'`))[0] as {
    vacuums: number
  }
  t.equal(theirs.vacuums, 0, "another application's table is not vacuumed")
  await sql('DROP TABLE their_table')
  // The plain tables (and default partitions) of a migrated database: each is in the list, but for
  // those the sweep vacuums by its own count of what it deleted, and Prisma's bookkeeping.
  const plain = (
    (await sql(
      `SELECT relname AS name FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'
       AND (NOT relispartition OR relname IN ('messages_default', 'deliveries_default')) ORDER BY 1`,
    )) as { name: string }[]
  ).map((r) => r.name)
  const sweptByCount = ['_prisma_migrations', 'idempotency_keys', 'messages_default', 'messages_legacy']
  t.same(
    plain.filter((n) => !sweptByCount.includes(n)),
    [...VACUUMED_TABLES].sort(),
    'VACUUMED_TABLES names every table of hookq the sweep does not vacuum by count',
  )
})

// Idempotency keys live in a table of their own (idempotency_keys): a repeat within the topic's
// retention answers the first produce's coordinates, from HTTP and from the outbox alike; the
// retention sweep deletes the keys past it, several sweepers at once deleting each key once; and
// outbox rows set aside go after the attempt retention. Keys are aged in the database, not waited for.
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { RetentionSweeper } from '../../src/service/retention.ts'
import { attemptPartitionPlan } from '../../src/store/attempt-partitions.ts'
import { api } from '../helpers/api.ts'
import { testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

const RETENTION_MS = 60_000
const db = await testDatabase(t)
const broker: Broker = await createBroker(
  loadConfig({
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
    LOG_LEVEL: 'silent',
    HOOKQ_ATTEMPT_RETENTION_MS: String(RETENTION_MS),
  }),
)
t.teardown(() => broker.close())
const { call, produce } = api(broker)
const sweeper = (sliceRows: number, errors: unknown[]) =>
  new RetentionSweeper(broker.db, {
    intervalMs: 60_000,
    attemptRetentionMs: RETENTION_MS,
    attemptPartitions: attemptPartitionPlan(RETENTION_MS, 60_000),
    sliceRows,
    onError: (err) => errors.push(err),
  })
const keysOf = async (topic: string) =>
  (
    await broker.db.pool.query<{ key: string }>(
      `SELECT i.key FROM idempotency_keys i JOIN topics t ON t.id = i.topic_id WHERE t.name = $1 ORDER BY i.key`,
      [topic],
    )
  ).rows.map((r) => r.key)
/** Moves a topic's keys (all, or those named) `ms` into the past. */
const age = (topic: string, ms: number, keys?: string[]) =>
  broker.db.pool.query(
    `UPDATE idempotency_keys i SET produced_at = produced_at - $2::bigint * interval '1 millisecond' FROM topics t
     WHERE t.id = i.topic_id AND t.name = $1 AND ($3::text[] IS NULL OR i.key = ANY($3))`,
    [topic, ms, keys ?? null],
  )

t.test('a repeat within the retention answers the same offsets; the sweep frees the key after it', async (t) => {
  await call('PUT', '/v1/topics/idem', { partitions: 3, retentionMs: RETENTION_MS })
  const first = (
    await produce('idem', [
      { value: 'a', idempotencyKey: 'k1' },
      { value: 'b', idempotencyKey: 'k2' },
    ])
  ).json.results
  const again = (
    await produce('idem', [
      { value: 'a2', idempotencyKey: 'k1' },
      { value: 'b2', idempotencyKey: 'k2' },
    ])
  ).json.results
  t.same(
    again,
    first.map((r: { partition: number; offset: number }) => ({ partition: r.partition, offset: r.offset, duplicate: true })),
  )

  // k1 past the retention, k2 not: the sweep deletes k1 only, and k1 stores a new message again.
  await age('idem', RETENTION_MS + 1000, ['k1'])
  const errors: unknown[] = []
  const swept = await sweeper(100, errors).sweep()
  t.same(errors, [])
  t.equal(swept.idempotencyKeys, 1)
  t.same(await keysOf('idem'), ['k2'])
  const later = (
    await produce('idem', [
      { value: 'a3', idempotencyKey: 'k1' },
      { value: 'b3', idempotencyKey: 'k2' },
    ])
  ).json.results
  t.notOk(later[0].duplicate, 'k1 no longer deduplicates')
  t.not(`${later[0].partition}:${later[0].offset}`, `${first[0].partition}:${first[0].offset}`)
  t.same(later[1], { partition: first[1].partition, offset: first[1].offset, duplicate: true }, 'k2 still does')
  t.same(await keysOf('idem'), ['k1', 'k2'])
})

t.test('an expired key a produce meets is freed at once, without waiting for the sweep', async (t) => {
  await call('PUT', '/v1/topics/idem-now', { partitions: 1, retentionMs: RETENTION_MS })
  const first = (await produce('idem-now', [{ value: 1, idempotencyKey: 'x' }])).json.results[0]
  await age('idem-now', RETENTION_MS + 1000)
  const second = (await produce('idem-now', [{ value: 2, idempotencyKey: 'x' }])).json.results[0]
  t.same(second, { partition: 0, offset: first.offset + 1 })
  const third = (await produce('idem-now', [{ value: 3, idempotencyKey: 'x' }])).json.results[0]
  t.same(third, { partition: 0, offset: second.offset, duplicate: true }, 'the new key deduplicates')
})

t.test('the outbox deduplicates against the same keys as HTTP produce', async (t) => {
  await call('PUT', '/v1/topics/idem-tx', { partitions: 1, retentionMs: RETENTION_MS })
  const http = (await produce('idem-tx', [{ value: 'http', idempotencyKey: 'shared' }])).json.results[0]
  await broker.db.pool.query(`SELECT hookq_produce('idem-tx', '"sql"', idempotency_key => 'shared')`)
  await broker.db.pool.query(`SELECT hookq_produce('idem-tx', '"sql only"', idempotency_key => 'own')`)
  const values = async () =>
    (
      await broker.db.pool.query<{ value: string }>(
        `SELECT m.value FROM messages m JOIN topics t ON t.id = m.topic_id WHERE t.name = 'idem-tx' ORDER BY m."offset"`,
      )
    ).rows.map((r) => JSON.parse(r.value))
  await waitUntil(async () => (await values()).length === 2, 30_000, 'the outbox row with a new key moved')
  await waitUntil(
    async () => Number((await broker.db.pool.query('SELECT count(*) AS n FROM produce_outbox')).rows[0].n) === 0,
    30_000,
    'the outbox emptied',
  )
  t.same(await values(), ['http', 'sql only'], 'the repeat of an HTTP key stored nothing')
  t.same(await keysOf('idem-tx'), ['own', 'shared'])
  t.equal(http.offset, 0)
})

t.test('sweepers running at once delete each expired key once', async (t) => {
  await call('PUT', '/v1/topics/idem-many', { partitions: 4, retentionMs: RETENTION_MS })
  const TOTAL = 500
  await produce(
    'idem-many',
    Array.from({ length: TOTAL }, (_, i) => ({ value: i, idempotencyKey: `m-${i}` })),
  )
  await age('idem-many', RETENTION_MS + 1000)
  const errors: unknown[] = []
  const results = await Promise.all([sweeper(7, errors).sweep(), sweeper(13, errors).sweep(), sweeper(50, errors).sweep()])
  t.same(errors, [])
  t.equal(
    results.reduce((n, r) => n + r.idempotencyKeys, 0),
    TOTAL,
    'the deletions add up to the keys there were',
  )
  t.same(await keysOf('idem-many'), [])
})

t.test('deleting a topic deletes its keys', async (t) => {
  await call('PUT', '/v1/topics/idem-gone', { partitions: 1 })
  await produce('idem-gone', [{ value: 1, idempotencyKey: 'g' }])
  t.same(await keysOf('idem-gone'), ['g'])
  const before = Number((await broker.db.pool.query('SELECT count(*) AS n FROM idempotency_keys')).rows[0].n)
  t.equal((await call('DELETE', '/v1/topics/idem-gone')).status, 204)
  const after = Number((await broker.db.pool.query('SELECT count(*) AS n FROM idempotency_keys')).rows[0].n)
  t.equal(after, before - 1)
})

t.test('outbox rows set aside go after the attempt retention', async (t) => {
  await broker.db.pool.query(
    `INSERT INTO produce_outbox_set_aside (id, topic_id, value, headers, delay_ms, created_at, set_aside_at, reason)
     VALUES (900001, 1, '1', '{}', 0, now(), now() - interval '2 minutes', 'old'),
            (900002, 1, '2', '{}', 0, now(), now(), 'fresh')`,
  )
  const errors: unknown[] = []
  const swept = await sweeper(100, errors).sweep()
  t.same(errors, [])
  t.equal(swept.setAside, 1)
  const left = await broker.db.pool.query<{ reason: string }>('SELECT reason FROM produce_outbox_set_aside ORDER BY id')
  t.same(
    left.rows.map((r) => r.reason),
    ['fresh'],
  )
})
t.test('where autovacuum does not run, the sweep vacuums the keys it deleted once there are enough', async (t) => {
  await call('PUT', '/v1/topics/idem-vac', { partitions: 1, retentionMs: RETENTION_MS })
  await produce(
    'idem-vac',
    Array.from({ length: 300 }, (_, i) => ({ value: i, idempotencyKey: `v-${i}` })),
  )
  await age('idem-vac', RETENTION_MS + 1000)
  const vacuums = async () =>
    Number(
      (await broker.db.pool.query(`SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'`)).rows[0].vacuum_count,
    )
  const before = await vacuums()
  const errors: unknown[] = []
  const sweeper = new RetentionSweeper(broker.db, {
    intervalMs: 60_000,
    attemptRetentionMs: RETENTION_MS,
    attemptPartitions: attemptPartitionPlan(RETENTION_MS, 60_000),
    sliceRows: 1000,
    vacuumMessages: true,
    onError: (err) => errors.push(err),
  })
  t.equal((await sweeper.sweep()).idempotencyKeys, 300)
  t.same(errors, [])
  await waitUntil(async () => (await vacuums()) > before, 10_000, 'idempotency_keys vacuumed')
})

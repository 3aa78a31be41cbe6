// The attempt log's retention (HOOKQ_ATTEMPT_RETENTION_MS): expired attempts leave the deliveries
// log with their partitions, but never the one a message still in progress counts from, and sweeps
// running at once drop each partition once. The sweep is driven directly with a clock past the
// retention and one partition span (30 s for this retention), so the current partition goes too.
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { RetentionSweeper } from '../../src/service/retention.ts'
import { attemptPartitionPlan } from '../../src/store/attempt-partitions.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const RETENTION_MS = 60_000
const PLAN = attemptPartitionPlan(RETENTION_MS, 60_000)
/** A clock this far ahead puts every partition holding attempts made so far past the retention. */
const pastRetention = () => Date.now() + RETENTION_MS + PLAN.spanMs + 1000
/** What a sweep deleted, without the partition count. */
const deleted = async (sweep: Promise<{ messages: number; attempts: number }>) => {
  const { messages, attempts } = await sweep
  return { messages, attempts }
}

const db = await testDatabase(t)
const open = (): Promise<Broker> =>
  createBroker(
    loadConfig({
      DATABASE_URL: db.url,
      HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
      LOG_LEVEL: 'silent',
      HOOKQ_ATTEMPT_RETENTION_MS: String(RETENTION_MS),
    }),
  )

type Attempt = { offset: number; attempt: number; outcome: string }
async function logged(broker: Broker, group: string): Promise<Attempt[]> {
  const res = await api(broker).call('GET', `/v1/groups/${group}/deliveries?limit=1000`)
  return (res.json.deliveries as Attempt[])
    .map(({ offset, attempt, outcome }) => ({ offset, attempt, outcome }))
    .sort((a, b) => a.offset - b.offset || a.attempt - b.attempt)
}

t.test('expired attempts leave the log; a message in progress keeps counting from its newest one', async (t) => {
  let broker = await open()
  t.teardown(() => broker.close())
  const { call, produce } = api(broker)
  // Offset 0 fails, but its attempt 2 is left unanswered (in flight until the process goes); the
  // others succeed (auto mode: completed out of order above offset 0).
  const pushes: { offset: number; attempt: number }[] = []
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { offset: number; attempt: number }
    pushes.push({ offset: env.offset, attempt: env.attempt })
    if (env.offset !== 0) return { status: 200 }
    return env.attempt === 2 ? { hang: true } : { status: 500 }
  })
  await call('PUT', '/v1/topics/kept', { partitions: 1 })
  await call('PUT', '/v1/groups/kept-g', {
    topic: 'kept',
    ackMode: 'auto',
    ackTimeoutMs: 120_000,
    pushTimeoutMs: 120_000,
    maxDeliveries: 4,
    retry: { initialDelayMs: 0, multiplier: 1, maxDelayMs: 0, jitter: 0 },
  })
  await call('POST', '/v1/groups/kept-g/consumers', { url: receiver.url })
  await produce(
    'kept',
    Array.from({ length: 5 }, (_, i) => ({ value: i })),
  )
  const expected: Attempt[] = [
    { offset: 0, attempt: 1, outcome: 'failed' },
    { offset: 0, attempt: 2, outcome: 'in_flight' },
    ...[1, 2, 3, 4].map((offset) => ({ offset, attempt: 1, outcome: 'acked' })),
  ]
  await waitUntil(async () => JSON.stringify(await logged(broker, 'kept-g')) === JSON.stringify(expected), 15_000, 'six attempts logged')

  t.same(await deleted(broker.retention.sweep(Date.now())), { messages: 0, attempts: 0 }, 'nothing is older than the retention yet')
  const swept = await broker.retention.sweep(pastRetention())
  t.equal(swept.attempts, 5, 'the completed messages’ attempts and the older attempt of offset 0 are deleted')
  t.same(await logged(broker, 'kept-g'), [{ offset: 0, attempt: 2, outcome: 'in_flight' }], 'the attempt in flight stays')
  t.same(await deleted(broker.retention.sweep(pastRetention())), { messages: 0, attempts: 0 }, 'a second sweep finds nothing more')

  // A new process counts offset 0's attempts from the log: the next push is attempt 3, and the 4th dead-letters it.
  await broker.close()
  broker = await open()
  await waitUntil(
    async () => (await api(broker).call('GET', '/v1/groups/kept-g')).json.partitions[0].committedOffset === 5,
    15_000,
    'offset 0 dead-lettered after its 4th attempt',
  )
  t.same(
    pushes.filter((p) => p.offset === 0).map((p) => p.attempt),
    [1, 2, 3, 4],
    'offset 0 was pushed as attempts 1 to 4, each once, and no more',
  )
  await waitUntil(async () => (await logged(broker, 'kept-g')).some((a) => a.outcome === 'dead'), 10_000, 'the last attempt logged as dead')
  t.same(await logged(broker, 'kept-g'), [
    { offset: 0, attempt: 2, outcome: 'failed' },
    { offset: 0, attempt: 3, outcome: 'failed' },
    { offset: 0, attempt: 4, outcome: 'dead' },
  ])
  t.equal((await broker.retention.sweep(pastRetention())).attempts, 3, 'once dead-lettered (completed) its attempts go too')
  t.same(await logged(broker, 'kept-g'), [])
})

t.test('the attempts of a message deleted by its topic’s retention go with it, completed or not', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { call, produce, sql } = api(broker)
  const receiver = await startReceiver(t, { status: 500 })
  await call('PUT', '/v1/topics/gone', { partitions: 1, retentionMs: 60_000 })
  // One failed attempt, the next not before 100 s: the message stays in progress.
  await call('PUT', '/v1/groups/gone-g', { topic: 'gone', ackMode: 'auto', retry: { initialDelayMs: 100_000, maxDelayMs: 100_000 } })
  await call('POST', '/v1/groups/gone-g/consumers', { url: receiver.url })
  await produce('gone', [{ value: 'old' }])
  await waitUntil(async () => (await logged(broker, 'gone-g')).length === 1, 15_000, 'the first attempt logged')
  t.equal((await broker.retention.sweep(pastRetention())).attempts, 0, 'the newest attempt of a message in progress stays')
  await sql(`UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'gone'`)
  t.same(
    await deleted(broker.retention.sweep(pastRetention())),
    { messages: 1, attempts: 1 },
    'the message past its retention, then its attempt',
  )
  t.same(await logged(broker, 'gone-g'), [])
})

t.test('a message in flight past its retention: its attempt stays, and its consumer’s ack completes it', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { call, produce, sql, ack, groupStatus } = api(broker)
  // Answered 200 in explicit mode: in flight until acked, with an ack deadline far off.
  const receiver = await startReceiver(t, { status: 200 })
  await call('PUT', '/v1/topics/slow', { partitions: 1, retentionMs: 60_000 })
  await call('PUT', '/v1/groups/slow-g', { topic: 'slow', ackTimeoutMs: 600_000 })
  await call('POST', '/v1/groups/slow-g/consumers', { url: receiver.url })
  await produce('slow', [{ value: 'slow' }])
  const [push] = await receiver.waitFor(1)
  const deliveryId = (push!.json as { deliveryId: string }).deliveryId
  await waitUntil(async () => (await logged(broker, 'slow-g')).length === 1, 15_000, 'the attempt logged')
  // The consumer takes longer than both retentions.
  await sql(`UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'slow'`)
  const swept = await broker.retention.sweep(pastRetention())
  t.match(swept, { messages: 1, attempts: 0 }, 'the message goes with its retention; its attempt in flight stays')
  t.ok(swept.attemptPartitions > 0, 'the partition it was in was dropped')
  t.same(await logged(broker, 'slow-g'), [{ offset: 0, attempt: 1, outcome: 'in_flight' }])
  t.same(await ack('slow-g', [deliveryId]), ['acked'], 'the ack finds it')
  t.equal((await groupStatus('slow-g')).partitions[0].committedOffset, 1, 'and completes the message')
})

t.test('where autovacuum does not run, the sweep vacuums the messages it deleted once there are enough', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { call, produce, sql } = api(broker)
  await call('PUT', '/v1/topics/vac', { partitions: 1, retentionMs: 60_000 })
  await produce(
    'vac',
    Array.from({ length: 40 }, (_, i) => ({ value: i })),
  )
  const sweeper = new RetentionSweeper(broker.db, {
    intervalMs: 60_000,
    attemptRetentionMs: RETENTION_MS,
    attemptPartitions: PLAN,
    sliceRows: 1000,
    vacuumMessages: true,
    onError: (err) => t.error(err),
  })
  // Aged rows leave their chunk for the topic's default partition, where the sweep deletes them:
  // that partition is what it vacuums (the chunks go whole).
  const vacuums = async () =>
    Number(
      (
        await sql(
          `SELECT s.vacuum_count FROM pg_stat_user_tables s JOIN topics t ON s.relname = 'messages_t' || t.id || '_default' WHERE t.name = 'vac'`,
        )
      )[0]!.vacuum_count,
    )
  const before = await vacuums()
  const age = () =>
    sql(`UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'vac'`)
  await age()
  t.equal((await sweeper.sweep()).messages, 40)
  t.equal(await vacuums(), before, '40 deleted: fewer than autovacuum would wait for (50 and a fifth of the rows)')
  await produce(
    'vac',
    Array.from({ length: 40 }, (_, i) => ({ value: i })),
  )
  await age()
  t.equal((await sweeper.sweep()).messages, 40)
  await waitUntil(async () => (await vacuums()) === before + 1, 5000, '80 deleted since: vacuumed once')
})

t.test('sweeps running at once delete each expired attempt once and fail nothing', async (t) => {
  const broker = await open()
  t.teardown(() => broker.close())
  const { call, produce } = api(broker)
  const receiver = await startReceiver(t)
  await call('PUT', '/v1/topics/many', { partitions: 4 })
  await call('PUT', '/v1/groups/many-g', { topic: 'many', ackMode: 'auto' })
  await call('POST', '/v1/groups/many-g/consumers', { url: receiver.url })
  const TOTAL = 600
  await produce(
    'many',
    Array.from({ length: TOTAL }, (_, i) => ({ value: i })),
  )
  const count = async () =>
    (
      await broker.db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = 'many-g' AND d.outcome = 'acked'`,
      )
    ).rows[0]!.n
  await waitUntil(async () => (await count()) === TOTAL, 20_000, 'every push logged as acked')

  // As several broker processes would: sweepers of their own, small slices so that they interleave.
  const errors: unknown[] = []
  const sweeper = (sliceRows: number) =>
    new RetentionSweeper(broker.db, {
      intervalMs: 60_000,
      attemptRetentionMs: RETENTION_MS,
      attemptPartitions: PLAN,
      sliceRows,
      onError: (err) => errors.push(err),
    })
  // The partitions hold the earlier tests' attempts too (one database for the file): all of them go.
  const before = Number((await broker.db.pool.query<{ n: string }>('SELECT count(*) AS n FROM deliveries')).rows[0]!.n)
  const now = pastRetention()
  const results = await Promise.all([broker.retention.sweep(now), sweeper(7).sweep(now), sweeper(13).sweep(now), sweeper(50).sweep(now)])
  t.same(errors, [])
  t.equal(
    results.reduce((n, r) => n + r.attempts, 0),
    before,
    'the deletions add up to the rows there were: none deleted twice',
  )
  t.equal(
    results.filter((r) => r.attempts > 0).length,
    1,
    "one process dropped the attempts' partitions; the others waited their turn (and, this clock being past the real one, dropped the empty partitions made since)",
  )
  t.equal(await count(), 0, 'every expired attempt is gone')
})

t.test(
  'a server where autovacuum cannot run is named at start-up: nothing would reclaim what retention deletes',
  { skip: needsServer },
  async (t) => {
    // track_counts off (settable per session) stops autovacuum as surely as autovacuum=off (server-wide).
    const lines: string[] = []
    const broker = await createBroker(
      loadConfig({
        DATABASE_URL: `${db.url}?options=${encodeURIComponent('-c track_counts=off')}`,
        HOOKQ_DB_POOL_SIZE: '2',
        LOG_LEVEL: 'silent',
      }),
      { log: (line) => lines.push(line) },
    )
    t.teardown(() => broker.close())
    t.match(lines.join('\n'), /WARNING: PostgreSQL runs with autovacuum off: hookq vacuums the messages its retention deletes itself/)
  },
)

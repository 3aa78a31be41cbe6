/**
 * The attempt log's partitions on real PostgreSQL: attempts written into partitions of a past
 * clock, then maintenance at the real clock drops those past the retention whole, across their
 * boundaries, carrying forward the newest attempt of each message still in progress (attempt
 * counts read after it are right) and an attempt still in flight; rows no partition covers wait in
 * the default partition and are filed at the next maintenance; processes maintaining at once drop
 * each partition once, without an error.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import {
  listAttemptPartitions,
  maintainAttemptPartitions,
  partitionsToCreate,
  type PartitionPlan,
} from '../../src/store/attempt-partitions.ts'
import { attemptCounts } from '../../src/store/consumption.ts'
import { pgTypes } from '../../src/store/db.ts'
import { insertAttempts, listAttempts, type AttemptStart } from '../../src/store/deliveries.ts'
import { newDeliveryId } from '../../src/core/delivery-id.ts'
import { tableSizes } from '../../src/store/storage.ts'
import { testDatabase } from '../helpers/db.ts'

const SPAN_MS = 60_000
const PLAN: PartitionPlan = { spanMs: SPAN_MS, aheadMs: 2 * SPAN_MS }

t.test('partitionsToCreate: aligned spans from the newest one kept, or from the previous span', async (t) => {
  const now = 10 * SPAN_MS + 5000
  t.same(
    partitionsToCreate([], now, PLAN).map((p) => [p.fromMs / SPAN_MS, p.toMs / SPAN_MS]),
    [
      [9, 10],
      [10, 11],
      [11, 12],
      [12, 13],
    ],
    'none kept: the previous span to two spans ahead',
  )
  const migrated = { name: 'deliveries_0_x', fromMs: 0, toMs: 10 * SPAN_MS + 1234 }
  t.same(
    partitionsToCreate([migrated], now, PLAN).map((p) => [p.fromMs, p.toMs]),
    [
      [10 * SPAN_MS + 1234, 11 * SPAN_MS],
      [11 * SPAN_MS, 12 * SPAN_MS],
      [12 * SPAN_MS, 13 * SPAN_MS],
    ],
    'after the migrated table, the first one ends on the next boundary',
  )
  t.same(partitionsToCreate([{ name: 'x', fromMs: 0, toMs: 20 * SPAN_MS }], now, PLAN), [], 'covered far enough ahead')
  t.same(
    partitionsToCreate([{ name: 'x', fromMs: 11 * SPAN_MS + 500, toMs: 12 * SPAN_MS }], now, PLAN).map((p) => [p.fromMs, p.toMs]),
    [
      [9 * SPAN_MS, 10 * SPAN_MS],
      [10 * SPAN_MS, 11 * SPAN_MS],
      [11 * SPAN_MS, 11 * SPAN_MS + 500],
      [12 * SPAN_MS, 13 * SPAN_MS],
    ],
    'the gaps around a partition kept ahead are filled, cut where it begins',
  )
})

t.test('maintenance drops whole partitions past the retention and keeps what attempt counts need', async (t) => {
  const db = await testDatabase(t)
  // Several sessions on a server; the embedded database serves one at a time (the processes
  // maintaining at once below then take turns, and must still drop each partition once).
  const pool = new pg.Pool({ connectionString: db.url, max: Math.min(db.maxConnections, 6), types: pgTypes })
  t.teardown(() => pool.end())
  const sql = async (text: string, params: unknown[] = []) => (await pool.query(text, params)).rows

  // A topic of one partition with messages 0..6 (5's deleted by its retention since), a group that
  // completed 0..2 and 6 (out of order), and so has 3, 4 and 5 in progress.
  const [topic] = await sql(`INSERT INTO topics (name, partitions, retention_ms) VALUES ('t', 1, 60000) RETURNING id`)
  await sql(`INSERT INTO topic_partitions (topic_id, partition, next_offset) VALUES ($1, 0, 7)`, [topic.id])
  await sql(`INSERT INTO messages (topic_id, partition, "offset", value) SELECT $1, 0, o, '1' FROM generate_series(0, 6) o WHERE o <> 5`, [
    topic.id,
  ])
  const [group] = await sql(`INSERT INTO consumer_groups (name, topic, updated_at) VALUES ('g', 't', now()) RETURNING id`)
  await sql(`INSERT INTO group_offsets (group_id, topic_id, partition, committed_offset, pushed_offset) VALUES ($1, $2, 0, 3, 7)`, [
    group.id,
    topic.id,
  ])
  await sql(`INSERT INTO group_completions (group_id, topic_id, partition, "offset") VALUES ($1, $2, 0, 6)`, [group.id, topic.id])

  // The last migrated partition out of the way (empty here), then partitions for a clock 10 spans back.
  const realNow = Date.now()
  const base = Math.floor(realNow / SPAN_MS) * SPAN_MS - 10 * SPAN_MS
  const migrated = await listAttemptPartitions(pool)
  await maintainAttemptPartitions(pool, { nowMs: base + 1000, cutoffMs: Math.max(...migrated.map((p) => p.toMs)), plan: PLAN })
  t.same(
    (await listAttemptPartitions(pool)).map((p) => (p.fromMs - base) / SPAN_MS),
    [-1, 0, 1, 2],
    'partitions from the previous span to two ahead of the past clock',
  )

  /** Attempt `attempt` of `offset`, started `atS` seconds after base. */
  const attempt = (offset: number, n: number, atS: number, outcome: AttemptStart['outcome'] = 'failed'): AttemptStart => ({
    id: newDeliveryId({ groupId: group.id, partition: 0, offset, attempt: n }),
    groupId: group.id,
    topicId: topic.id,
    partition: 0,
    offset,
    attempt: n,
    consumerId: null,
    startedAtMs: base + atS * 1000,
    ackDeadlineMs: base + atS * 1000 + 30_000,
    outcome,
  })
  await insertAttempts(pool, [
    attempt(0, 1, 5, 'acked'), // completed
    attempt(1, 1, 65, 'acked'), // completed, next partition
    attempt(2, 1, 125, 'acked'), // completed, in the partition that stays
    attempt(3, 1, 10), // in progress: attempt 1 in the first partition,
    attempt(3, 2, 70), // attempt 2 in the next: only 2 is kept
    attempt(4, 1, 20), // in progress, alone
    attempt(5, 1, 30), // in progress, but its message is gone: not kept
    attempt(5, 2, 40, 'in_flight'), // ... unless in flight: its ack must find it
    attempt(6, 1, 50, 'acked'), // completed out of order
  ])
  const where = async () =>
    (await sql(`SELECT tableoid::regclass::text AS p, "offset", attempt FROM deliveries ORDER BY "offset", attempt`)).map(
      (r) => `${r.offset}.${r.attempt}@${r.p === 'deliveries_default' ? 'default' : (Number(r.p.split('_')[1]) - base) / SPAN_MS}`,
    )
  t.same(await where(), ['0.1@0', '1.1@1', '2.1@2', '3.1@0', '3.2@1', '4.1@0', '5.1@0', '5.2@0', '6.1@0'], 'each in its span')

  // The real clock now, and a retention that leaves only the span of base + 120 s onwards.
  const result = await maintainAttemptPartitions(pool, { nowMs: realNow, cutoffMs: base + 2 * SPAN_MS, plan: PLAN })
  t.match(result, { ran: true, droppedRows: 8, keptRows: 3 })
  t.same(
    result.dropped.map((name) => (Number(name.split('_')[1]) - base) / SPAN_MS),
    [-1, 0, 1],
    'the three partitions wholly past the retention',
  )
  const current = `${(Math.floor(realNow / SPAN_MS) * SPAN_MS - base) / SPAN_MS}`
  t.same(
    await where(),
    ['2.1@2', `3.2@${current}`, `4.1@${current}`, `5.2@${current}`],
    'the newest attempt of each message in progress (and the one in flight) carried into the current partition',
  )
  const parts = await listAttemptPartitions(pool)
  t.ok(
    parts.some((p) => p.fromMs <= realNow - SPAN_MS && realNow - SPAN_MS < p.toMs) &&
      parts.at(-1)!.toMs >= realNow + PLAN.aheadMs &&
      parts.every((p, i) => i === 0 || p.fromMs === parts[i - 1]!.toMs || p.fromMs <= realNow - SPAN_MS),
    'partitions cover from the previous span to two spans past the real clock (the range between, in the past, has none)',
  )

  const counts = await attemptCounts(pool, group.id, topic.id, 0, { committed: 3, completed: new Set([6]), pushed: 7, seekedAtMs: 0 })
  t.same(
    [...counts].sort((a, b) => a[0] - b[0]),
    [
      [3, 2],
      [4, 1],
      [5, 2],
    ],
    'attempt counts read after the drop: 3 goes on from 2',
  )
  const listed = await listAttempts(pool, group.id, { limit: 10, filedSinceMs: base + 2 * SPAN_MS })
  t.same(listed.map((r) => `${r.offset}.${r.attempt}`).sort(), ['2.1', '3.2', '4.1', '5.2'], 'listed with their own start times')
  t.equal(listed.find((r) => r.offset === 3)!.startedAt.getTime(), base + 70_000, 'a carried row keeps its start time')

  // Processes maintaining at once: one drops, the others skip their turn or find nothing to do.
  const later = { nowMs: realNow, cutoffMs: base + 3 * SPAN_MS, plan: PLAN }
  // Beside them, what else reads every partition: the storage gauges' sizes, listings, attempt counts.
  const readers = Promise.all(
    Array.from({ length: 4 }, async () => {
      await tableSizes(pool)
      await listAttempts(pool, group.id, { limit: 10 })
      await attemptCounts(pool, group.id, topic.id, 0, { committed: 3, completed: new Set([6]), pushed: 7, seekedAtMs: 0 })
    }),
  )
  const all = await Promise.all(Array.from({ length: 4 }, () => maintainAttemptPartitions(pool, later)))
  await readers // no error: no deadlock between them
  t.same(
    all.flatMap((r) => r.dropped).map((name) => (Number(name.split('_')[1]) - base) / SPAN_MS),
    [2],
    'the next partition dropped once',
  )
  t.equal(
    all.reduce((n, r) => n + r.droppedRows - r.keptRows, 0),
    1,
    'its completed attempt gone once; the carried rows were in the current partition and stay',
  )
  t.same(await where(), [`3.2@${current}`, `4.1@${current}`, `5.2@${current}`])
})

t.test('a row no partition covers waits in the default partition and is filed at the next maintenance', async (t) => {
  const db = await testDatabase(t)
  const pool = new pg.Pool({ connectionString: db.url, max: Math.min(db.maxConnections, 2), types: pgTypes })
  t.teardown(() => pool.end())
  const realNow = Date.now()
  await maintainAttemptPartitions(pool, { nowMs: realNow, cutoffMs: 0, plan: PLAN })
  // An hour ahead: past every partition made (written directly: insertAttempts leaves out rows of groups that do not exist).
  await pool.query(
    `INSERT INTO deliveries (id, group_id, topic_id, partition, "offset", attempt, started_at, outcome, filed_at)
     VALUES ('x', 1, 1, 0, 0, 1, now() + interval '1 hour', 'acked', now() + interval '1 hour')`,
  )
  const placed = async () => (await pool.query(`SELECT tableoid::regclass::text AS p FROM deliveries`)).rows.map((r) => r.p)
  t.same(await placed(), ['deliveries_default'])
  const result = await maintainAttemptPartitions(pool, { nowMs: realNow, cutoffMs: 0, plan: PLAN })
  t.same(result.created, [], 'no partition was due')
  const [p] = await placed()
  t.match(p, /^deliveries_\d+_\d+$/, 'filed into the current partition')
  const current = (await listAttemptPartitions(pool)).find((x) => x.name === p)!
  t.ok(current.fromMs <= realNow && realNow < current.toMs)
})

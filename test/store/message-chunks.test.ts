// The messages table's chunks (src/store/message-chunks.ts): each topic's messages go to chunks of
// its own, made when the topic is and ahead; a chunk goes whole once its end is past its topic's
// retention, whatever other topics keep; across a chunk boundary only the older chunk goes and reads
// start at the oldest message kept; a row no chunk covers waits in the default partition; a deleted
// topic's chunks go; maintenances at once drop each chunk once. A later clock (`nowMs`) stands for
// the time passing.
import t from 'tap'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { attemptPartitionPlan } from '../../src/store/attempt-partitions.ts'
import { listMessageChunks, maintainMessageChunks } from '../../src/store/message-chunks.ts'
import { listTopics } from '../../src/store/topics.ts'
import { api } from '../helpers/api.ts'
import { testDatabase } from '../helpers/db.ts'

const SHORT_MS = 60_000
const SPAN_MS = attemptPartitionPlan(SHORT_MS, 60_000).spanMs
const db = await testDatabase(t)
const broker: Broker = await createBroker(
  loadConfig({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)), LOG_LEVEL: 'silent' }),
)
t.teardown(() => broker.close())
const { call, produce, sql } = api(broker)
const maintain = async (nowMs?: number) =>
  maintainMessageChunks(broker.db.pool, {
    topics: await listTopics(broker.db.prisma),
    sweepIntervalMs: 60_000,
    wait: true,
    ...(nowMs === undefined ? {} : { nowMs }),
  })
/** Where each message of a topic is: its chunk's name (or messages_default), by offset. */
const placed = async (topic: string) =>
  (
    await sql(
      `SELECT m."offset"::int AS offset, m.tableoid::regclass::text AS chunk FROM messages m JOIN topics t ON t.id = m.topic_id
       WHERE t.name = $1 ORDER BY m."offset"`,
      [topic],
    )
  ).map((r) => r.chunk as string)
const topicId = async (name: string) => (await sql('SELECT id FROM topics WHERE name = $1', [name]))[0]!.id as number
const offsetsFrom0 = async (topic: string) =>
  (await call('GET', `/v1/topics/${topic}/partitions/0/messages?fromOffset=0`)).json.messages.map((m: { offset: number }) => m.offset)

t.test('a topic gets chunks of its own when made; a row no chunk covers waits in the default partition', async (t) => {
  await call('PUT', '/v1/topics/short', { partitions: 1, retentionMs: SHORT_MS })
  await call('PUT', '/v1/topics/long', { partitions: 1, retentionMs: 86_400_000 })
  await produce('short', [{ value: 0 }, { value: 1 }])
  await produce('long', [{ value: 0 }])
  const shortId = await topicId('short')
  const longId = await topicId('long')
  t.match(await placed('short'), [new RegExp(`^messages_${shortId}_\\d+_\\d+$`), new RegExp(`^messages_${shortId}_\\d+_\\d+$`)])
  t.match(await placed('long'), [new RegExp(`^messages_${longId}_\\d+_\\d+$`)])

  // Moved an hour before the long topic's oldest chunk (6 h spans for its day of retention): within
  // its retention, but no chunk covers it. It waits in the default partition, kept by maintenance.
  const oldest = (await listMessageChunks(broker.db.pool)).filter((c) => c.topicId === longId).sort((a, b) => a.fromMs - b.fromMs)[0]!
  await sql(`UPDATE messages SET produced_at = to_timestamp($2 / 1000.0) WHERE topic_id = $1`, [longId, oldest.fromMs - 3_600_000])
  t.same(await placed('long'), ['messages_default'])
  const kept = await maintain()
  t.equal(kept.strayRows, 0, 'within its retention: kept')
  t.same(await placed('long'), ['messages_default'])
  t.same(await offsetsFrom0('long'), [0], 'and read as any other')
  // Put back where a chunk covers it, for the tests below.
  await sql('UPDATE messages SET produced_at = now() WHERE topic_id = $1', [longId])
  t.match(await placed('long'), [new RegExp(`^messages_${longId}_`)])
  await produce('short', [{ value: 2 }])
  t.equal((await placed('short')).length, 3)
})

t.test('across a chunk boundary only the older chunk goes; reads start at the oldest kept; other topics keep theirs', async (t) => {
  // Offsets 0..2 of "short" moved to the last millisecond of the chunk before the current one
  // (chunks are made from a span back), 3..4 produced now.
  await maintain()
  const shortId = await topicId('short')
  const nowMs = Date.now()
  const current = (await listMessageChunks(broker.db.pool)).find((c) => c.topicId === shortId && c.fromMs <= nowMs && nowMs < c.toMs)!
  await sql(`UPDATE messages SET produced_at = to_timestamp($2 / 1000.0) WHERE topic_id = $1`, [shortId, current.fromMs - 1])
  await produce('short', [{ value: 3 }, { value: 4 }])
  const where = await placed('short')
  t.equal(new Set(where.slice(0, 3)).size, 1, '0..2 in one chunk')
  t.not(where[2], where[3], 'the boundary lies between 2 and 3')
  const older = (await listMessageChunks(broker.db.pool)).find((c) => c.name === where[0])!
  t.match(older, { topicId: shortId, toMs: current.fromMs })

  // Time passes until the older chunk's end is past the retention, not the newer's.
  const swept = await maintain(older.toMs + SHORT_MS)
  t.same(swept.dropped, [older.name])
  t.equal(swept.droppedRows, 3)
  t.same(await offsetsFrom0('short'), [3, 4], 'a read from 0 starts at the oldest kept')
  const topic = (await call('GET', '/v1/topics/short')).json
  t.match(topic.partitionStats, [{ partition: 0, startOffset: 3, endOffset: 5 }])
  t.same(await offsetsFrom0('long'), [0], 'a topic with a longer retention keeps its own')
  t.same((await produce('short', [{ value: 5 }])).json.results, [{ partition: 0, offset: 5 }], 'offsets are not reused')
})

t.test('maintenances at once drop each chunk once; a deleted topic’s chunks go', async (t) => {
  await call('PUT', '/v1/topics/gone', { partitions: 1, retentionMs: SHORT_MS })
  await maintain()
  await produce('gone', [{ value: 1 }])
  const goneId = await topicId('gone')
  t.ok((await listMessageChunks(broker.db.pool)).some((c) => c.topicId === goneId))
  t.equal((await call('DELETE', '/v1/topics/gone')).status, 204)

  // Far enough ahead that every chunk of "short" made so far is past its retention.
  const later = Date.now() + 10 * SPAN_MS + SHORT_MS
  const shortId = await topicId('short')
  const kept = (await sql(`SELECT count(*)::int AS n FROM messages WHERE topic_id = $1`, [shortId]))[0]!.n as number
  const results = await Promise.all([maintain(later), maintain(later), maintain(later)])
  // One took its turn and dropped the chunks with rows; the others waited, then (this clock being
  // past the real one) dropped only the empty chunks made since for now.
  t.equal(results.filter((r) => r.droppedRows > 0).length, 1, 'one maintenance dropped the rows')
  t.equal(
    results.reduce((n, r) => n + r.droppedRows, 0),
    kept,
    "the short topic's messages, each counted once",
  )
  const chunks = await listMessageChunks(broker.db.pool)
  t.notOk(
    chunks.some((c) => c.topicId === goneId),
    'the deleted topic has no chunk left',
  )
  t.same(await offsetsFrom0('short'), [])
  t.same(await offsetsFrom0('long'), [0])
})

// Messages' retention as groups see it: a group reading across a deleted range pushes only what is
// kept and its committed offset passes the range; a seek or a fetch into a deleted range starts at
// the oldest message kept (startOffset says which); a slow consumer's unacked messages that pass the
// retention are deleted under it, but its acks still complete them and none is pushed again; and
// sweepers running at once delete each message once. Messages are aged in the database, not waited
// for; the sweep is driven directly. These hold whether retention deletes rows or whole chunks.
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { RetentionSweeper } from '../../src/service/retention.ts'
import { attemptPartitionPlan } from '../../src/store/attempt-partitions.ts'
import { api } from '../helpers/api.ts'
import { testDatabase } from '../helpers/db.ts'
import { inOffsetOrder, startReceiver } from '../helpers/receiver.ts'
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
const { call, produce, sql, ack, groupStatus } = api(broker)
/** Moves a topic's messages from `from` up to `to` (exclusive) an hour into the past. */
const age = (topic: string, from: number, to: number) =>
  sql(
    `UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t
     WHERE t.id = m.topic_id AND t.name = $1 AND m."offset" >= $2 AND m."offset" < $3`,
    [topic, from, to],
  )
const committed = async (group: string) => (await groupStatus(group)).partitions[0].committedOffset as number
const offsets = (requests: { json: unknown }[]) => inOffsetOrder(requests as never).map((r) => (r.json as { offset: number }).offset)

t.test('a group reading across a deleted range pushes what is kept; a seek into it starts at the oldest kept', async (t) => {
  const receiver = await startReceiver(t)
  await call('PUT', '/v1/topics/across', { partitions: 1, retentionMs: RETENTION_MS })
  await call('PUT', '/v1/groups/across-g', { topic: 'across', ackMode: 'auto' })
  await call('POST', '/v1/groups/across-g/consumers', { url: receiver.url })
  await produce(
    'across',
    Array.from({ length: 5 }, (_, i) => ({ value: i })),
  )
  await waitUntil(async () => (await committed('across-g')) === 5, 15_000, 'the first five completed')

  // Paused while 5..14 arrive; 0..11 pass the retention (retention takes the front of the log), so
  // 5..11 are deleted before the group reads them.
  await call('PUT', '/v1/groups/across-g', { topic: 'across', ackMode: 'auto', paused: true })
  await produce(
    'across',
    Array.from({ length: 10 }, (_, i) => ({ value: 5 + i })),
  )
  await age('across', 0, 12)
  t.equal((await broker.retention.sweep()).messages, 12)
  await call('PUT', '/v1/groups/across-g', { topic: 'across', ackMode: 'auto', paused: false })
  await waitUntil(async () => (await committed('across-g')) === 15, 15_000, 'committed past the deleted range')
  t.same(offsets(receiver.requests), [0, 1, 2, 3, 4, 12, 13, 14], 'only kept messages pushed')

  // A fetch from below the kept range starts at the oldest kept; startOffset names it.
  const page = (await call('GET', '/v1/topics/across/partitions/0/messages?fromOffset=3&limit=2')).json
  t.same(
    page.messages.map((m: { offset: number }) => m.offset),
    [12, 13],
  )
  t.equal(page.nextOffset, 14)
  const topic = (await call('GET', '/v1/topics/across')).json
  t.match(topic.partitionStats, [{ partition: 0, startOffset: 12, endOffset: 15 }])

  // A seek into the deleted range: pushing starts again at the oldest kept, nothing below it.
  const before = receiver.requests.length
  t.equal((await call('POST', '/v1/groups/across-g/seek', { partition: 0, offset: 7 })).status, 200)
  await waitUntil(async () => receiver.requests.length === before + 3, 15_000, 'the kept messages pushed again')
  t.same(offsets(receiver.requests.slice(before)), [12, 13, 14])
  await waitUntil(async () => (await committed('across-g')) === 15, 15_000, 'completed again')
})

t.test('a slow consumer: unacked messages past the retention are deleted, its acks still complete them', async (t) => {
  // Answered 200 in explicit mode: in flight until acked, with an ack deadline far off.
  const receiver = await startReceiver(t, { status: 200 })
  await call('PUT', '/v1/topics/slow', { partitions: 1, retentionMs: RETENTION_MS })
  await call('PUT', '/v1/groups/slow-g', { topic: 'slow', ackTimeoutMs: 600_000 })
  await call('POST', '/v1/groups/slow-g/consumers', { url: receiver.url })
  await produce(
    'slow',
    Array.from({ length: 3 }, (_, i) => ({ value: i })),
  )
  const pushes = await receiver.waitFor(3)
  const ids = inOffsetOrder(pushes).map((r) => (r.json as { deliveryId: string }).deliveryId)

  // The consumer takes longer than the retention: the messages go, the deliveries in flight do not.
  await age('slow', 0, 3)
  t.equal((await broker.retention.sweep()).messages, 3)
  t.same((await call('GET', '/v1/topics/slow/partitions/0/messages?fromOffset=0')).json.messages, [], 'gone from the log')
  t.same(await ack('slow-g', ids), ['acked', 'acked', 'acked'], 'each ack finds its delivery')
  await waitUntil(async () => (await committed('slow-g')) === 3, 15_000, 'the acks complete the messages')

  // Nothing is pushed again: a new message is the next push.
  await produce('slow', [{ value: 'next' }])
  const [next] = (await receiver.waitFor(4)).slice(3)
  t.equal((next!.json as { offset: number }).offset, 3)
  t.equal(receiver.requests.length, 4)
})

t.test('sweepers running at once delete each expired message once', async (t) => {
  await call('PUT', '/v1/topics/many', { partitions: 4, retentionMs: RETENTION_MS })
  const TOTAL = 600
  await produce(
    'many',
    Array.from({ length: TOTAL }, (_, i) => ({ value: i })),
  )
  await age('many', 0, TOTAL)
  // As several broker processes would: sweepers of their own, small slices so that they interleave.
  const errors: unknown[] = []
  const sweeper = (sliceRows: number) =>
    new RetentionSweeper(broker.db, {
      intervalMs: 60_000,
      attemptRetentionMs: RETENTION_MS,
      attemptPartitions: attemptPartitionPlan(RETENTION_MS, 60_000),
      sliceRows,
      onError: (err) => errors.push(err),
    })
  const results = await Promise.all([broker.retention.sweep(), sweeper(7).sweep(), sweeper(13).sweep(), sweeper(50).sweep()])
  t.same(errors, [])
  t.equal(
    results.reduce((n, r) => n + r.messages, 0),
    TOTAL,
    'the deletions add up to the messages there were: none deleted twice',
  )
  const topic = (await call('GET', '/v1/topics/many')).json
  for (const p of topic.partitionStats) t.equal(p.startOffset, p.endOffset, `partition ${p.partition} keeps nothing`)
})

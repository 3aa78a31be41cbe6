/**
 * Dead-letter replay: through the CLI end to end (messages dead-lettered by a real receiver
 * answering 500, a dry run, a replay back to the original topic, a second replay that duplicates
 * nothing), and the SDK functions behind it (skips, limits, 429 and body-size handling).
 */
import { randomUUID } from 'node:crypto'
import t from '../helpers/tap.ts'
import { appendRows } from '../../src/store/messages.ts'
import {
  BatchProduceError,
  createClient,
  produceInBatches,
  replayDeadLetters,
  unwrap,
  withRetries,
  type HookqClient,
  type Message,
} from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli } from './run.ts'

const { broker, url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
// The tests run side by side: each has topics of its own (the last a broker of its own), and most of
// their time is CLI processes starting and a rate limit's Retry-After passing.
t.jobs = 3

const createTopic = (client: HookqClient, topic: string, partitions: number) =>
  unwrap(client.PUT('/v1/topics/{topic}', { params: { path: { topic } }, body: { partitions } }))
const endOffsets = async (client: HookqClient, topic: string) =>
  (await unwrap(client.GET('/v1/topics/{topic}', { params: { path: { topic } } }))).partitionStats.map((s) => s.endOffset)
const read = async (client: HookqClient, topic: string, partition: number, fromOffset = 0): Promise<Message[]> =>
  (
    await unwrap(
      client.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
        params: { path: { topic, partition }, query: { fromOffset, limit: 1000 } },
      }),
    )
  ).messages

t.test('dlq replay: dead letters go back to their topic once, however often it runs', async (t) => {
  await createTopic(hookq, 'orders', 2)
  await createTopic(hookq, 'orders.dlq', 1)
  const receiver = await startReceiver(t, { status: 500, body: 'down' })
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'billing' } },
      body: {
        topic: 'orders',
        ackMode: 'auto',
        maxDeliveries: 1,
        deadLetterTopic: 'orders.dlq',
      },
    }),
  )
  await unwrap(hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'billing' } }, body: { url: receiver.url } }))
  const originals = [
    { value: { id: 1 }, key: 'a', headers: { trace: 't1' }, partition: 1 },
    { value: { id: 2 }, partition: 0 },
    { value: 'three', headers: { trace: 't3' }, partition: 1 },
  ]
  await unwrap(hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'orders' } }, body: { messages: originals } }))
  await waitUntil(async () => (await endOffsets(hookq, 'orders.dlq'))[0] === 3, 20_000, 'three dead letters')
  // From now on the receiver is fine, so replayed messages are delivered and not dead-lettered again.
  receiver.setBehaviour({ status: 200 })

  const dry = await runCli(['dlq', 'replay', 'orders.dlq', '--dry-run'], { url })
  t.equal(dry.code, 0, dry.stderr)
  t.match(dry.stdout, /^would replay 3 of 3 dead letters read from orders\.dlq/)
  const dryJson = await runCli(['--json', 'dlq', 'replay', 'orders.dlq', '--dry-run'], { url })
  t.match(
    JSON.parse(dryJson.stdout),
    {
      dryRun: true,
      read: 3,
      wouldReplay: 3,
      replayed: 0,
      duplicates: 0,
      byTopic: { orders: { wouldReplay: 3, replayed: 0, duplicates: 0 } },
    },
    'the JSON says what the table does: nothing replayed, none replayed before',
  )
  t.same(await endOffsets(hookq, 'orders'), [1, 2], 'a dry run produces nothing')

  const replay = await runCli(['--json', 'dlq', 'replay', 'orders.dlq'], { url })
  t.equal(replay.code, 0, replay.stderr)
  t.match(JSON.parse(replay.stdout), {
    read: 3,
    replayed: 3,
    duplicates: 0,
    skipped: 0,
    byTopic: { orders: { replayed: 3, duplicates: 0 } },
  })
  t.same(await endOffsets(hookq, 'orders'), [2, 4], 'each back on its original partition')
  const back = [...(await read(hookq, 'orders', 0, 1)), ...(await read(hookq, 'orders', 1, 2))]
  t.same(
    back.map((m) => [m.partition, m.key, m.value, m.headers]).sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))),
    [
      [0, null, { id: 2 }, {}],
      [1, 'a', { id: 1 }, { trace: 't1' }],
      [1, null, 'three', { trace: 't3' }],
    ].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))),
    'key, value and headers, without the hookq-dlq-* headers',
  )

  const again = await runCli(['dlq', 'replay', 'orders.dlq'], { url })
  t.equal(again.code, 0, again.stderr)
  t.match(again.stdout, /replayed 0 of 3 dead letters .*3 had been replayed before/)
  t.same(await endOffsets(hookq, 'orders'), [2, 4], 'the second replay stored nothing')

  // A dry run after the replay decides as a real run does: by the broker's idempotency keys.
  const dryAfter = await runCli(['dlq', 'replay', 'orders.dlq', '--dry-run'], { url })
  t.equal(dryAfter.code, 0, dryAfter.stderr)
  t.match(
    dryAfter.stdout,
    /^would replay 0 of 3 dead letters read from orders\.dlq; 3 had been replayed before and would not be produced again/,
  )
  t.match(dryAfter.stdout, /orders\s+0\s+3/, 'the table: 0 would replay, 3 already replayed')
  t.notMatch(dryAfter.stdout, /\?/, 'no unknowns')
  t.match(JSON.parse((await runCli(['--json', 'dlq', 'replay', 'orders.dlq', '--dry-run'], { url })).stdout), {
    wouldReplay: 0,
    replayed: 0,
    duplicates: 3,
    byTopic: { orders: { wouldReplay: 0, replayed: 0, duplicates: 3 } },
  })
  t.same(await endOffsets(hookq, 'orders'), [2, 4], 'and stored nothing')
  t.same(await endOffsets(hookq, 'orders.dlq'), [3], 'and the replayed messages were delivered, not dead-lettered again')
})

t.test('replayDeadLetters: skips what it cannot replay, honours fromOffset and limit', async (t) => {
  await createTopic(hookq, 'mixed.dlq', 1)
  await createTopic(hookq, 'target', 1)
  const dlq = (topic: string, offset: number) => ({
    'hookq-dlq-topic': topic,
    'hookq-dlq-partition': '0',
    'hookq-dlq-offset': String(offset),
    'hookq-dlq-group': 'g',
  })
  // Dead letters made by hand: produce (HTTP and hookq_produce alike) refuses hookq-dlq-* headers,
  // so they are appended the way the broker's dead-lettering appends them, below every produce path.
  const made: { value: string; headers?: Record<string, string> }[] = [
    { value: 'plain, not a dead letter' },
    { value: 'its topic is gone', headers: dlq('deleted-topic', 0) },
    { value: 'r1', headers: dlq('target', 0) },
    { value: 'r2', headers: dlq('target', 1) },
    { value: 'r3', headers: dlq('target', 2) },
  ]
  const topicId = Number((await broker.db.pool.query(`SELECT id FROM topics WHERE name = 'mixed.dlq'`)).rows[0].id)
  await appendRows(
    broker.db.pool,
    made.map((m) => ({
      topicId,
      partition: 0,
      key: null,
      value: JSON.stringify(m.value),
      headers: JSON.stringify(m.headers ?? {}),
      delayMs: 0,
      idempotencyKey: null,
      traceId: randomUUID().replaceAll('-', ''),
      traceparent: null,
      tracestate: null,
    })),
  )
  await waitUntil(async () => (await endOffsets(hookq, 'mixed.dlq'))[0] === made.length, 10_000, 'the outbox moved the dead letters')

  const progress: number[] = []
  const first = await replayDeadLetters(hookq, 'mixed.dlq', { limit: 4, batchSize: 2, onProgress: (p) => progress.push(p.read) })
  t.match(first, { read: 4, replayed: 2, skipped: 2, partitions: [{ partition: 0, fromOffset: 0, nextOffset: 4 }] })
  t.same(
    first.skips.map((s) => s.offset),
    [0, 1],
  )
  t.match(first.skips[0]!.reason, /not a dead letter/)
  t.match(first.skips[1]!.reason, /deleted-topic does not exist/)
  t.same(progress, [0, 2, 4, 4], 'progress after each round')
  t.same(
    (await read(hookq, 'target', 0)).map((m) => m.value),
    ['r1', 'r2'],
    'the limit stopped it after four dead letters read',
  )

  const rest = await replayDeadLetters(hookq, 'mixed.dlq', { fromOffset: 2 })
  t.match(rest, { read: 3, replayed: 1, duplicates: 2, skipped: 0 })
  t.same(
    (await read(hookq, 'target', 0)).map((m) => m.value),
    ['r1', 'r2', 'r3'],
  )

  await t.rejects(replayDeadLetters(hookq, 'mixed.dlq', { partitions: [5] }), /no partition 5/)
  await t.rejects(replayDeadLetters(hookq, 'no-such.dlq'), { code: 'topic_not_found' })
})

t.test('produceInBatches: waits out 429, halves calls the broker finds too large, reports what was committed', async (t) => {
  const limited = await startListeningBroker(t, {
    HOOKQ_RATE_LIMIT_PER_KEY: '2',
    HOOKQ_MAX_REQUEST_BYTES: '4096',
    HOOKQ_MAX_MESSAGE_BYTES: '2048',
  })
  const client = createClient({ baseUrl: limited.url, apiKey: '' })
  await createTopic(client, 'small', 1)

  // 16 messages of ~620 bytes: calls of 16 and 8 are over the 4 KiB body limit, so they are halved
  // down to calls of 4; seven calls in all, more than the rate limit's burst of 4.
  const big = Array.from({ length: 16 }, (_, i) => ({ value: { i, pad: 'x'.repeat(600) } }))
  const retries: number[] = []
  // The bucket kept empty until the batches met the limit: four loops of calls on the same bucket
  // take each token as it comes back, from before the batches start. Spending only the burst first
  // was not enough: on a loaded machine the seven calls came slower than the bucket refills (2 a
  // second) and none met a 429.
  let produced = false
  let spent = false
  const spend = async () => {
    while (retries.length === 0 && !produced) {
      if ((await client.GET('/v1/topics')).response.status === 429) spent = true
    }
  }
  const spenders = Array.from({ length: 4 }, spend)
  let results: Awaited<ReturnType<typeof produceInBatches>>
  try {
    await waitUntil(() => spent, 120_000, 'the bucket spent')
    results = await produceInBatches(client, 'small', big, { maxBatchBytes: 1 << 20, onRetry: (_e, waitMs) => retries.push(waitMs) })
  } finally {
    produced = true // the spenders stop, whatever happened
  }
  await Promise.all(spenders)
  t.same(
    results.map((r) => r.offset),
    Array.from({ length: 16 }, (_, i) => i),
    'all committed, in order',
  )
  // The test's own reads are rate-limited too, so they wait the same way.
  t.same(
    (await withRetries(() => read(client, 'small', 0))).map((m) => (m.value as { i: number }).i),
    Array.from({ length: 16 }, (_, i) => i),
  )
  t.ok(retries.length > 0, 'the rate limit (2 a second) answered the batches 429 at least once and was waited out')
  t.ok(
    retries.every((ms) => ms >= 1000),
    'after its Retry-After',
  )

  const failing = [{ value: 1 }, { value: 2 }, { value: 'x'.repeat(3000) }, { value: 4 }]
  const err = await produceInBatches(client, 'small', failing, { maxBatchMessages: 2 }).catch((e: unknown) => e)
  t.ok(err instanceof BatchProduceError)
  t.match(err, { committed: 2, failedIndex: 2, cause: { status: 413, code: 'message_too_large' } })
  t.equal((await withRetries(() => endOffsets(client, 'small')))[0], 18, 'the first call committed, nothing after the failure')
})

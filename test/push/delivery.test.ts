import t from '../helpers/tap.ts'
import { verifyWebhook } from '@hookq/client/consumer'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { inOffsetOrder, startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce } = api(broker)

t.test('explicit mode: pushed with the envelope and signature, acked, committed offset moves', async (t) => {
  await call('PUT', '/v1/topics/orders', { partitions: 1 })
  const secret = `whsec_${Buffer.alloc(32, 3).toString('base64')}`
  await call('PUT', '/v1/groups/billing', { topic: 'orders' })
  const receiver = await startReceiver(t)
  await call('POST', '/v1/groups/billing/consumers', { url: `${receiver.url}/hook`, secret })
  await produce('orders', [{ value: { n: 1 }, key: 'k1', headers: { h: 'v' } }, { value: 'two' }])
  await receiver.waitFor(2, 10_000)
  const [first, second] = inOffsetOrder(receiver.requests)
  const env = first!.json as Record<string, unknown>
  t.match(env, { topic: 'orders', group: 'billing', partition: 0, offset: 0, key: 'k1', value: { n: 1 }, headers: { h: 'v' }, attempt: 1 })
  t.match(env.deliveryId, /^[A-Za-z0-9_-]{48}$/, 'coordinates and 128 random bits, base64url')
  t.ok(Date.parse(env.ackDeadline as string) > Date.now(), 'ack deadline in the future')
  t.equal(first!.headers['webhook-id'], `msg_${(await broker.db.pool.query(`SELECT id FROM topics WHERE name = 'orders'`)).rows[0].id}_0_0`)
  t.doesNotThrow(
    () => verifyWebhook({ headers: first!.headers, body: first!.body, secret }),
    'signature verifies (as a consumer checks it)',
  )

  const before = (await call('GET', '/v1/groups/billing')).json
  t.match(before.partitions[0], { committedOffset: 0, endOffset: 2, lag: 2, inFlight: 2 })

  const ack = await call('POST', '/v1/groups/billing/acks', { deliveryIds: [(second!.json as { deliveryId: string }).deliveryId] })
  t.same(
    ack.json.results.map((r: { status: string }) => r.status),
    ['acked'],
  )
  t.match(
    (await call('GET', '/v1/groups/billing')).json.partitions[0],
    { committedOffset: 0, inFlight: 1 },
    'offset 1 completed out of order; committed stays',
  )
  const ack2 = await call('POST', '/v1/groups/billing/acks', { deliveryIds: [env.deliveryId, env.deliveryId, 'nonexistent-id'] })
  t.same(
    ack2.json.results.map((r: { status: string }) => r.status),
    ['acked', 'already_completed', 'unknown'],
  )
  t.match((await call('GET', '/v1/groups/billing')).json.partitions[0], { committedOffset: 2, lag: 0, inFlight: 0 })
  const { rows } = await broker.db.pool.query(`SELECT count(*)::int AS n FROM group_completions`)
  t.equal(rows[0].n, 0, 'completions below the committed offset are gone')
  await waitUntil(
    async () => {
      const r = await broker.db.pool.query(`SELECT outcome FROM deliveries ORDER BY "offset"`)
      return r.rows.length === 2 && r.rows.every((x) => x.outcome === 'acked')
    },
    5000,
    'attempt rows acked',
  )
})

t.test('no ack: redelivered after the deadline with attempt 2, a new delivery id, the same webhook-id', async (t) => {
  await call('PUT', '/v1/topics/slow', { partitions: 1 })
  await call('PUT', '/v1/groups/slow-g', {
    topic: 'slow',
    ackTimeoutMs: 1000,
    pushTimeoutMs: 500,
    retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
  })
  const receiver = await startReceiver(t)
  await call('POST', '/v1/groups/slow-g/consumers', { url: receiver.url })
  await produce('slow', [{ value: 'x' }])
  await receiver.waitFor(2, 10_000)
  const [a, b] = receiver.requests.map((r) => r.json as { deliveryId: string; attempt: number })
  t.equal(a!.attempt, 1)
  t.equal(b!.attempt, 2)
  t.not(a!.deliveryId, b!.deliveryId)
  t.equal(receiver.requests[0]!.headers['webhook-id'], receiver.requests[1]!.headers['webhook-id'])
  // A late ack of the first attempt still completes the message and cancels the next redelivery.
  const ack = await call('POST', '/v1/groups/slow-g/acks', { deliveryIds: [a!.deliveryId] })
  t.equal(ack.json.results[0].status, 'acked')
  t.match((await call('GET', '/v1/groups/slow-g')).json.partitions[0], { committedOffset: 1, inFlight: 0 })
  const seen = receiver.requests.length
  await new Promise((r) => setTimeout(r, 1500))
  t.equal(receiver.requests.length, seen, 'no push after the ack')
})

t.test('auto mode: a 2xx is the ack; failures retry with backoff and end in the dead-letter topic', async (t) => {
  await call('PUT', '/v1/topics/jobs', { partitions: 2 })
  await call('PUT', '/v1/topics/jobs.dlq', { partitions: 1 })
  await call('PUT', '/v1/groups/workers', {
    topic: 'jobs',
    ackMode: 'auto',
    maxDeliveries: 3,
    deadLetterTopic: 'jobs.dlq',
    retry: { initialDelayMs: 50, multiplier: 2, maxDelayMs: 1000, jitter: 0 },
  })
  const receiver = await startReceiver(t, (req) =>
    (req.json as { value: string }).value === 'poison' ? { status: 500, body: 'boom' } : { status: 200 },
  )
  await call('POST', '/v1/groups/workers/consumers', { url: receiver.url })
  await produce('jobs', [
    { value: 'ok-1', partition: 0 },
    { value: 'poison', partition: 0, key: 'kp' },
    { value: 'ok-2', partition: 1 },
  ])
  await waitUntil(
    async () => {
      const s = (await call('GET', '/v1/groups/workers')).json
      return s.partitions.every((p: { lag: number }) => p.lag === 0)
    },
    15_000,
    'everything completed',
  )
  const poison = receiver.requests.filter((r) => (r.json as { value: string }).value === 'poison')
  t.equal(poison.length, 3, 'maxDeliveries attempts')
  t.same(
    poison.map((r) => (r.json as { attempt: number }).attempt),
    [1, 2, 3],
  )
  const dlq = (await call('GET', '/v1/topics/jobs.dlq/partitions/0/messages')).json.messages
  t.equal(dlq.length, 1)
  t.match(dlq[0], {
    key: 'kp',
    value: 'poison',
    headers: {
      'hookq-dlq-topic': 'jobs',
      'hookq-dlq-partition': '0',
      'hookq-dlq-offset': '1',
      'hookq-dlq-group': 'workers',
      'hookq-dlq-attempts': '3',
      'hookq-dlq-error': /HTTP 500: boom/,
    },
  })
})

t.test('messages deleted by retention before they were pushed do not hold the committed offset back', async (t) => {
  await call('PUT', '/v1/topics/aged', { partitions: 1, retentionMs: 60_000 })
  await produce(
    'aged',
    Array.from({ length: 5 }, (_, i) => ({ value: i })),
  )
  await call('PUT', '/v1/groups/aged-g', { topic: 'aged', ackMode: 'auto' })
  await broker.db.pool.query(
    `UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'aged' AND m."offset" < 3`,
  )
  await broker.retention.sweep()
  const receiver = await startReceiver(t)
  await call('POST', '/v1/groups/aged-g/consumers', { url: receiver.url })
  await waitUntil(
    async () => (await call('GET', '/v1/groups/aged-g')).json.partitions[0].committedOffset === 5,
    10_000,
    'committed offset past the deleted messages',
  )
  t.same(
    receiver.requests.map((r) => (r.json as { offset: number }).offset).sort((a, b) => a - b),
    [3, 4],
    'only the kept messages are pushed (in parallel: any order)',
  )
})

t.test('a message pushed straight from produce (not read back) is the stored one, to the millisecond', async (t) => {
  await call('PUT', '/v1/topics/tail', { partitions: 1 })
  await call('PUT', '/v1/groups/tail-g', { topic: 'tail', ackMode: 'auto' })
  const arrivedAt = new Map<number, number>()
  const receiver = await startReceiver(t, (req) => {
    arrivedAt.set((req.json as { offset: number }).offset, Date.now())
    return { status: 200 }
  })
  await call('POST', '/v1/groups/tail-g/consumers', { url: receiver.url })
  // The group is caught up, so these go from produce to the push without a read of the log.
  const sent = [
    { value: { s: 'a\u0000b', n: [1, { z: 1, a: 2 }] }, key: 'k', headers: { x: 'y' } },
    { value: null },
    { value: 'd', delayMs: 300 },
  ]
  await produce('tail', sent)
  await receiver.waitFor(3, 10_000)
  const stored = (await call('GET', '/v1/topics/tail/partitions/0/messages?fromOffset=0&limit=10')).json.messages
  const pushed = receiver.requests.map((r) => r.json as Record<string, unknown>).sort((a, b) => (a.offset as number) - (b.offset as number))
  t.same(
    pushed.map((p) => ({ offset: p.offset, key: p.key, value: p.value, headers: p.headers, timestamp: p.timestamp })),
    stored.map((m: Record<string, unknown>) => ({
      offset: m.offset,
      key: m.key,
      value: m.value,
      headers: m.headers,
      timestamp: m.timestamp,
    })),
  )
  t.equal(JSON.stringify(pushed[0]!.value), JSON.stringify(sent[0]!.value), 'key order and NUL kept')
  // The broker's and this process's clocks are the same clock; 2 ms for its rounding to whole ms.
  t.ok(arrivedAt.get(2)! >= Date.parse(stored[2].timestamp) + 300 - 2, 'the delay counts from the stored produce time')
})

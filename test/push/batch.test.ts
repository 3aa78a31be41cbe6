/**
 * Batch push (contract v1.1 "Batch push") against a real broker and receiver: up to maxMessages
 * messages of a partition in one POST `{"deliveries": [...]}`, in offset order, signed over the
 * batch; `{"failed": [...]}` in a 2xx fails those messages only, a non-2xx fails them all; each
 * message keeps its own attempts and rows; explicit mode waits for each message's own ack.
 */
import t from '../helpers/tap.ts'
import { verifyWebhook } from '@hookq/client/consumer'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import type { Envelope } from '../helpers/push-group.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, allCompleted, ack } = api(broker)

const deliveries = (r: Received) => (r.json as { deliveries: Envelope[] }).deliveries
const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`

async function batchGroup(name: string, settings: object, partitions = 1) {
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  const res = await call('PUT', `/v1/groups/${name}-g`, { topic: name, ...settings })
  t.equal(res.status, 201, JSON.stringify(res.json))
  return res.json
}

t.test('the setting: validated, needs the envelope format, given whole, null removes it', async (t) => {
  t.equal((await call('PUT', '/v1/topics/bs', { partitions: 1 })).status, 201)
  for (const batch of [
    { maxMessages: 0 },
    { maxMessages: 1001 },
    { maxMessages: 5, maxWaitMs: 10_001 },
    { maxMessages: 5, maxBytes: 10 },
    { maxWaitMs: 5 },
    { maxMessages: 5, other: 1 },
  ]) {
    t.equal((await call('PUT', '/v1/groups/bs-g', { topic: 'bs', batch })).status, 400, JSON.stringify(batch))
  }
  const raw = await call('PUT', '/v1/groups/bs-g', { topic: 'bs', pushFormat: 'raw', batch: { maxMessages: 5 } })
  t.equal(raw.status, 400)
  t.match(raw.json.detail, /batch needs pushFormat "envelope"/)
  t.equal((await call('GET', '/v1/groups/bs-g')).status, 404, 'nothing was created')
  t.same((await call('PUT', '/v1/groups/bs-g', { topic: 'bs', batch: { maxMessages: 5 } })).json.batch, {
    maxMessages: 5,
    maxWaitMs: 0,
    maxBytes: null,
  })
  t.equal((await call('PUT', '/v1/groups/bs-g', { topic: 'bs', pushFormat: 'raw' })).status, 400, 'raw refused while batching')
  t.same(
    (await call('PUT', '/v1/groups/bs-g', { topic: 'bs', maxInFlight: 9 })).json.batch,
    { maxMessages: 5, maxWaitMs: 0, maxBytes: null },
    'kept when not named',
  )
  t.same((await call('PUT', '/v1/groups/bs-g', { topic: 'bs', batch: { maxMessages: 7, maxBytes: 4096 } })).json.batch, {
    maxMessages: 7,
    maxWaitMs: 0,
    maxBytes: 4096,
  })
  t.equal((await call('PUT', '/v1/groups/bs-g', { topic: 'bs', batch: null })).json.batch, null)
})

t.test('batches of up to maxMessages, in offset order, signed over the batch; every message once', async (t) => {
  const receiver = await startReceiver(t)
  await batchGroup('b1', { ackMode: 'auto', maxInFlight: 200, batch: { maxMessages: 10 } })
  t.equal((await call('POST', '/v1/groups/b1-g/consumers', { url: receiver.url, secret: SECRET })).status, 201)
  t.equal(
    (
      await produce(
        'b1',
        Array.from({ length: 95 }, (_, i) => ({ value: { i } })),
      )
    ).status,
    201,
  )
  await allCompleted('b1-g', 20_000)

  const offsets: number[] = []
  for (const r of receiver.requests) {
    const ds = deliveries(r)
    t.ok(ds.length >= 1 && ds.length <= 10, `a batch of ${ds.length}`)
    t.same(
      ds.map((d) => d.offset),
      [...ds.map((d) => d.offset)].sort((a, b) => a - b),
      'in offset order',
    )
    t.equal(r.headers['hookq-batch-size'], String(ds.length))
    t.match(r.headers['webhook-id'], /^batch_/, 'webhook-id names the batch')
    const verified = verifyWebhook({ secret: SECRET, headers: r.headers as Record<string, string>, body: r.body })
    t.equal(verified.webhookId, r.headers['webhook-id'], 'the signature verifies over the batch body')
    offsets.push(...ds.map((d) => d.offset))
  }
  t.same(
    offsets.sort((a, b) => a - b),
    Array.from({ length: 95 }, (_, i) => i),
    'every message exactly once',
  )
  t.ok(receiver.requests.length < 95, `fewer POSTs than messages (${receiver.requests.length})`)
  const metrics = (await broker.app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(metrics, /hookq_batch_size_count\{group="b1-g"\} [1-9]/)
  // The listing writes this broker's finished attempts first (they wait up to 20 ms for company).
  await call('GET', '/v1/groups/b1-g/deliveries?limit=1')
  const rows = await sql(`SELECT count(*)::int AS n, count(DISTINCT d."offset")::int AS messages FROM deliveries d
    JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = 'b1-g' AND d.outcome = 'acked'`)
  t.same(rows[0], { n: 95, messages: 95 }, 'one attempt row per message, acked')
})

t.test('a backlog read back from the log in many reads: every message once', async (t) => {
  // Paused while produced, so nothing comes from produce's tail: the partitions read it all back,
  // reading ahead while a read batch (200) is still half full. maxInFlight not a multiple of either.
  const receiver = await startReceiver(t)
  await batchGroup('b9', { ackMode: 'auto', maxInFlight: 150, batch: { maxMessages: 40 }, paused: true }, 2)
  t.equal((await call('POST', '/v1/groups/b9-g/consumers', { url: receiver.url })).status, 201)
  for (let i = 0; i < 1200; i += 300) {
    t.equal(
      (
        await produce(
          'b9',
          Array.from({ length: 300 }, (_, j) => ({ value: i + j, partition: (i + j) % 2 })),
        )
      ).status,
      201,
    )
  }
  t.equal(
    (await call('PUT', '/v1/groups/b9-g', { topic: 'b9', ackMode: 'auto', maxInFlight: 150, batch: { maxMessages: 40 }, paused: false }))
      .status,
    200,
  )
  await allCompleted('b9-g', 30_000)
  const seen = new Map<number, number[]>()
  for (const r of receiver.requests) {
    const ds = deliveries(r)
    t.ok(
      ds.every((d, i) => i === 0 || d.offset > ds[i - 1]!.offset),
      'a batch in offset order',
    )
    for (const d of ds) seen.set(d.partition, [...(seen.get(d.partition) ?? []), d.offset])
  }
  // Batches go out side by side, so they may arrive in any order; each is in order itself (above).
  for (const p of [0, 1])
    t.same(
      seen.get(p)!.sort((a, b) => a - b),
      Array.from({ length: 600 }, (_, i) => i),
      `partition ${p}: each offset once`,
    )
})

t.test('a 2xx listing failed ids fails those only; a non-2xx fails the whole batch', async (t) => {
  let firstBatch: number[] | undefined
  const receiver = await startReceiver(t, (r) => {
    // The first batch fails whole; after it, odd offsets are named as failed in their first two 2xx answers.
    if (!firstBatch) {
      firstBatch = deliveries(r).map((d) => d.offset)
      return { status: 503 }
    }
    const failed = deliveries(r)
      .filter((d) => d.offset % 2 === 1 && d.attempt <= (firstBatch!.includes(d.offset) ? 3 : 2))
      .map((d) => d.deliveryId)
    return { status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ failed }) }
  })
  await batchGroup('b2', {
    ackMode: 'auto',
    maxDeliveries: 5,
    batch: { maxMessages: 20 },
    retry: { initialDelayMs: 10, maxDelayMs: 10, jitter: 0 },
  })
  t.equal((await call('POST', '/v1/groups/b2-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'b2',
        Array.from({ length: 6 }, (_, i) => ({ value: i })),
      )
    ).status,
    201,
  )
  await allCompleted('b2-g', 20_000)
  t.ok(firstBatch!.length >= 1)
  const attempts = new Map<number, number[]>()
  for (const r of receiver.requests) for (const d of deliveries(r)) attempts.set(d.offset, [...(attempts.get(d.offset) ?? []), d.attempt])
  for (let o = 0; o < 6; o++) {
    const n = (firstBatch!.includes(o) ? 1 : 0) + (o % 2 === 1 ? 2 : 0) + 1
    t.same(
      attempts.get(o),
      Array.from({ length: n }, (_, i) => i + 1),
      `offset ${o}: ${n} attempts`,
    )
  }
  const inFirst = firstBatch![0]!
  const rows = await sql(
    `SELECT d.attempt, d.outcome, d.error FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
    WHERE g.name = 'b2-g' AND d."offset" = $1 ORDER BY d.attempt`,
    [inFirst],
  )
  t.match(rows[0], { attempt: 1, outcome: 'failed', error: /^HTTP 503/ }, 'the failed batch: an attempt row per message')
  // The attempt log is written after the completion (within its flush delay): wait for the last outcome.
  const odd = await waitUntil(
    async () => {
      const rows = await sql(`SELECT d.attempt, d.outcome, d.error FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
      WHERE g.name = 'b2-g' AND d."offset" = 5 ORDER BY d.attempt`)
      return rows.at(-1)?.outcome === 'in_flight' ? undefined : rows
    },
    10_000,
    'the last attempt of offset 5 written with its outcome',
  )
  t.match(odd.at(-2), { outcome: 'failed', error: /listed in "failed" by the batch answer/ })
  t.match(odd.at(-1), { outcome: 'acked' })
  // Attempts are counted per message, by how each ended; the duration once per POST.
  const metrics = (await broker.app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(metrics, /hookq_pushes_total\{group="b2-g",outcome="delivered"\} 6\n/)
  t.match(metrics, new RegExp(`hookq_pushes_total\\{group="b2-g",outcome="rejected"\\} ${firstBatch!.length + 6}\\n`))
  t.match(metrics, new RegExp(`hookq_push_duration_seconds_count\\{group="b2-g"\\} ${receiver.requests.length}\\n`))
})

t.test("explicit mode: a delivered batch waits for each message's own ack", async (t) => {
  const receiver = await startReceiver(t)
  await batchGroup('b3', { ackMode: 'explicit', ackTimeoutMs: 60_000, batch: { maxMessages: 50 } })
  t.equal((await call('POST', '/v1/groups/b3-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'b3',
        Array.from({ length: 5 }, (_, i) => ({ value: i })),
      )
    ).status,
    201,
  )
  const [first] = await receiver.waitFor(1, 10_000)
  await waitUntil(() => receiver.requests.flatMap(deliveries).length >= 5, 10_000, 'all five pushed')
  // By offset: if the five came in more than one batch, the batches ran in parallel.
  const ids = receiver.requests
    .flatMap(deliveries)
    .sort((a, b) => a.offset - b.offset)
    .map((d) => d.deliveryId)
  t.ok(deliveries(first!).length >= 1)
  t.same(await ack('b3-g', ids.slice(0, 4)), ['acked', 'acked', 'acked', 'acked'])
  const nack = await call('POST', '/v1/groups/b3-g/nacks', { deliveryIds: [ids[4]], delayMs: 0 })
  t.equal(nack.status, 200)
  const again = await waitUntil(() => receiver.requests.flatMap(deliveries).find((d) => d.attempt === 2), 10_000, 'the nacked one again')
  t.equal(again.offset, 4)
  t.same(await ack('b3-g', [again.deliveryId]), ['acked'])
  await allCompleted('b3-g')
})

t.test('maxWaitMs gathers messages produced apart; maxBytes bounds a batch', async (t) => {
  const receiver = await startReceiver(t)
  await batchGroup('b4', { ackMode: 'auto', batch: { maxMessages: 100, maxWaitMs: 3000 } })
  t.equal((await call('POST', '/v1/groups/b4-g/consumers', { url: receiver.url })).status, 201)
  t.equal((await produce('b4', [{ value: 'a' }, { value: 'b' }])).status, 201)
  t.equal((await produce('b4', [{ value: 'c' }])).status, 201)
  await allCompleted('b4-g', 20_000)
  t.same(
    receiver.requests.map((r) => deliveries(r).map((d) => d.value)),
    [['a', 'b', 'c']],
    'one batch of the three',
  )

  const sized = await startReceiver(t)
  const big = 'x'.repeat(400)
  await batchGroup('b5', { ackMode: 'auto', batch: { maxMessages: 100, maxBytes: 2048 } })
  t.equal((await call('POST', '/v1/groups/b5-g/consumers', { url: sized.url })).status, 201)
  t.equal(
    (
      await produce(
        'b5',
        Array.from({ length: 8 }, (_, i) => ({ value: `${big}${i}` })),
      )
    ).status,
    201,
  )
  await allCompleted('b5-g', 20_000)
  t.ok(
    sized.requests.every((r) => Buffer.byteLength(r.body) <= 2048),
    `every body within 2048 bytes (${sized.requests.map((r) => Buffer.byteLength(r.body)).join(', ')})`,
  )
  t.equal(sized.requests.flatMap(deliveries).length, 8)
  t.ok(
    sized.requests.some((r) => deliveries(r).length > 1),
    'and still several messages a batch',
  )
})

t.test('with ordering by key a batch carries one message of a key, and keys stay in order', async (t) => {
  const receiver = await startReceiver(t, { status: 200, delayMs: 5 })
  await batchGroup('b6', { ackMode: 'auto', ordering: 'key', maxInFlight: 100, batch: { maxMessages: 50 } })
  t.equal((await call('POST', '/v1/groups/b6-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'b6',
        Array.from({ length: 60 }, (_, i) => ({ key: `k${i % 4}`, value: i })),
      )
    ).status,
    201,
  )
  await allCompleted('b6-g', 20_000)
  const batches = receiver.requests.map(deliveries)
  t.ok(
    batches.every((b) => new Set(b.map((d) => (d.value as number) % 4)).size === b.length),
    'no two messages of a key in one batch',
  )
  t.ok(
    batches.some((b) => b.length > 1),
    'keys share batches',
  )
  const byKey = new Map<number, number[]>()
  for (const d of batches.flat()) byKey.set((d.value as number) % 4, [...(byKey.get((d.value as number) % 4) ?? []), d.offset])
  for (const [k, offsets] of byKey)
    t.same(
      offsets,
      [...offsets].sort((a, b) => a - b),
      `k${k} in offset order`,
    )
  t.equal(batches.flat().length, 60, 'every message once')
})

t.test('a batch is filled from the messages that are ready, whatever the push window starts at', async (t) => {
  // 25 messages at once, maxMessages 10 (above the window's first size, 8): each batch waits
  // maxWaitMs only for messages that are not ready yet, so the first two are full.
  const receiver = await startReceiver(t)
  await batchGroup('b7', { ackMode: 'auto', batch: { maxMessages: 10, maxWaitMs: 500 } })
  t.equal((await call('POST', '/v1/groups/b7-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'b7',
        Array.from({ length: 25 }, (_, i) => ({ value: i })),
      )
    ).status,
    201,
  )
  await allCompleted('b7-g', 20_000)
  const batches = receiver.requests.map((r) => deliveries(r).map((d) => d.offset)).sort((a, b) => a[0]! - b[0]!)
  t.same(
    batches.map((b) => b.length),
    [10, 10, 5],
    'full batches of ten, then the five left',
  )
  t.same(
    batches.flat(),
    Array.from({ length: 25 }, (_, i) => i),
    'every message once, in offset order',
  )
})

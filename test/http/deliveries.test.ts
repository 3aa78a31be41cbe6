import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

interface Delivery {
  deliveryId: string
  partition: number
  offset: number
  attempt: number
  consumerId: string | null
  startedAt: string
  finishedAt: string | null
  statusCode: number | null
  error: string | null
  outcome: string
  durationMs: number | null
}

const broker = await startBroker(t)
const call = async (method: string, url: string, payload?: unknown) => {
  const res = await broker.app.inject({ method: method as 'GET', url, ...(payload === undefined ? {} : { payload: payload as object }) })
  return { status: res.statusCode, json: res.json() }
}
const list = async (query = ''): Promise<Delivery[]> => {
  const res = await call('GET', `/v1/groups/log/deliveries?limit=1000${query}`)
  if (res.status !== 200) throw new Error(JSON.stringify(res.json))
  return res.json.deliveries
}
const sentValue = (d: Delivery) => ['ack', 'fail', 'nack', 'timeout', 'wait'][d.partition * 3 + d.offset] ?? `bulk-${d.offset}`

// One message per outcome. maxDeliveries 2 and a 50 ms backoff let `fail` go failed → dead quickly;
// `timeout` is never acked on its first attempt: its deadline is moved to 1 ms away (extend), so it
// times out then. The group's own ack timeout is long: on a loaded machine a 2 s one ran out before
// the test got to ack or nack the others, which then went dead (at maxDeliveries 2) and answered
// already_completed.
await call('PUT', '/v1/topics/events', { partitions: 2 })
await call('PUT', '/v1/groups/log', {
  topic: 'events',
  ackTimeoutMs: 120_000,
  maxDeliveries: 2,
  retry: { initialDelayMs: 50, multiplier: 1, maxDelayMs: 50, jitter: 0 },
})
const receiver = await startReceiver(t, (req) =>
  (req.json as { value: string }).value === 'fail' ? { status: 500, body: 'boom' } : { status: 200 },
)
const consumer = (await call('POST', '/v1/groups/log/consumers', { url: receiver.url })).json
await call('POST', '/v1/topics/events/messages', {
  messages: [
    { value: 'ack', partition: 0 },
    { value: 'fail', partition: 0 },
    { value: 'nack', partition: 0 },
    { value: 'timeout', partition: 1 },
    { value: 'wait', partition: 1 },
  ],
})
const pushes = (value: string) =>
  receiver.requests.map((r) => r.json as { deliveryId: string; value: string; attempt: number }).filter((e) => e.value === value)
await waitUntil(() => ['ack', 'nack', 'timeout', 'wait'].every((v) => pushes(v).length > 0), 10_000, 'first pushes')

t.test('in_flight: attempts pushed and not yet settled', async (t) => {
  const inFlight = await waitUntil(
    async () => {
      const rows = await list('&outcome=in_flight')
      return rows.some((d) => sentValue(d) === 'wait') ? rows : undefined
    },
    5000,
    'the wait attempt listed in flight',
  )
  t.ok(inFlight.every((d) => d.outcome === 'in_flight' && d.finishedAt === null))
})

t.test('every outcome, each filter, and the fields of an attempt', async (t) => {
  const ack = async (id: string) => (await call('POST', '/v1/groups/log/acks', { deliveryIds: [id] })).json.results[0].status
  t.equal(await ack(pushes('ack')[0]!.deliveryId), 'acked')
  // No wait: an ack answered by this process is in the listing that follows it.
  t.same(
    (await list('&partition=0&offset=0')).map((d) => d.outcome),
    ['acked'],
    'the ack is listed at once',
  )
  t.equal(await ack(pushes('wait')[0]!.deliveryId), 'acked')
  t.equal(
    (await call('POST', '/v1/groups/log/nacks', { deliveryIds: [pushes('nack')[0]!.deliveryId], delayMs: 600_000 })).json.results[0].status,
    'nacked',
  )
  t.equal(
    (await call('POST', '/v1/groups/log/extend', { deliveryIds: [pushes('timeout')[0]!.deliveryId], extendMs: 1 })).json.results[0].status,
    'extended',
  )
  await waitUntil(() => pushes('timeout').length >= 2, 10_000, 'timeout pushed again')
  t.equal(await ack(pushes('timeout')[1]!.deliveryId), 'acked')
  // Settled: only `nack` stays outstanding (waiting out its 10 minutes), so no row changes any more.
  const all = await waitUntil(
    async () => {
      const rows = await list()
      return rows.length === 7 && rows.every((d) => d.outcome !== 'in_flight') ? rows : undefined
    },
    10_000,
    'seven settled attempts',
  )

  const byValue = (v: string) => all.filter((d) => sentValue(d) === v).map((d) => [d.attempt, d.outcome])
  t.same(byValue('ack'), [[1, 'acked']])
  t.same(
    byValue('fail'),
    [
      [2, 'dead'],
      [1, 'failed'],
    ],
    'newest first: the last attempt dead-lettered',
  )
  t.same(byValue('nack'), [[1, 'nacked']])
  t.same(byValue('timeout'), [
    [2, 'acked'],
    [1, 'timed_out'],
  ])
  t.same(byValue('wait'), [[1, 'acked']])

  const failed = all.find((d) => d.outcome === 'failed')!
  t.match(failed, { partition: 0, offset: 1, attempt: 1, consumerId: consumer.id, statusCode: 500, error: /HTTP 500: boom/ })
  t.ok(failed.durationMs !== null && failed.durationMs >= 0)
  t.ok(Date.parse(failed.finishedAt!) >= Date.parse(failed.startedAt))
  // Marked dead, the last attempt still says why it ended; a nacked one says it was nacked.
  const dead = all.find((d) => d.outcome === 'dead')!
  t.match(dead, { offset: 1, attempt: 2, statusCode: 500, error: /HTTP 500: boom/ }, 'the dead attempt keeps its cause')
  t.ok(dead.finishedAt !== null && dead.durationMs !== null)
  t.match(
    all.find((d) => d.outcome === 'nacked'),
    { error: 'nacked by the consumer' },
  )
  t.equal(all.find((d) => sentValue(d) === 'ack')!.deliveryId, pushes('ack')[0]!.deliveryId, 'the id the consumer was given')

  for (const outcome of ['acked', 'failed', 'timed_out', 'nacked', 'dead', 'in_flight']) {
    const rows = await list(`&outcome=${outcome}`)
    t.same(
      rows,
      all.filter((d) => d.outcome === outcome),
      `outcome=${outcome}`,
    )
  }
  t.same(
    await list('&partition=1'),
    all.filter((d) => d.partition === 1),
    'partition=1',
  )
  t.same(
    (await list('&partition=0&offset=1')).map((d) => d.attempt),
    [2, 1],
    "partition and offset: one message's attempts",
  )
  t.same(
    await list('&offset=0'),
    all.filter((d) => d.offset === 0),
    'offset alone spans partitions',
  )
  t.same(
    await list('&partition=1&outcome=acked'),
    all.filter((d) => d.partition === 1 && d.outcome === 'acked'),
    'filters combine',
  )
})

t.test('paging: newest first, no duplicates, no gaps, null cursor on the last page', async (t) => {
  await call('POST', '/v1/topics/events/messages', {
    messages: Array.from({ length: 20 }, (_, i) => ({ value: `bulk-${i}`, partition: 1 })),
  })
  await waitUntil(
    () => receiver.requests.filter((r) => /^bulk/.test((r.json as { value: string }).value)).length >= 20,
    10_000,
    'bulk pushed',
  )
  const ids = receiver.requests
    .map((r) => r.json as { deliveryId: string; value: string })
    .filter((e) => /^bulk/.test(e.value))
    .map((e) => e.deliveryId)
  t.same(
    (await call('POST', '/v1/groups/log/acks', { deliveryIds: ids })).json.results.map((r: { status: string }) => r.status),
    ids.map(() => 'acked'),
  )
  const all = await waitUntil(
    async () => {
      const rows = await list()
      return rows.length === 27 && rows.every((d) => d.outcome !== 'in_flight') ? rows : undefined
    },
    10_000,
    'bulk attempts settled',
  )
  for (let i = 1; i < all.length; i++) t.ok(all[i - 1]!.startedAt >= all[i]!.startedAt, 'newest first')

  for (const limit of [1, 5, 26, 27]) {
    const seen: Delivery[] = []
    let cursor: string | null = null
    let pages = 0
    do {
      const res = await call('GET', `/v1/groups/log/deliveries?limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`)
      t.equal(res.status, 200)
      t.ok(res.json.deliveries.length <= limit)
      seen.push(...res.json.deliveries)
      cursor = res.json.nextCursor
      pages++
    } while (cursor !== null && pages < 100)
    t.same(seen, all, `limit ${limit}: the pages put together are the whole log`)
    t.equal(pages, Math.ceil(27 / limit), `limit ${limit}: no empty last page`)
  }
  const filtered = await call('GET', '/v1/groups/log/deliveries?partition=1&outcome=acked&limit=4')
  const second = await call('GET', `/v1/groups/log/deliveries?partition=1&outcome=acked&limit=100&cursor=${filtered.json.nextCursor}`)
  t.same(
    [...filtered.json.deliveries, ...second.json.deliveries],
    all.filter((d) => d.partition === 1 && d.outcome === 'acked'),
    'cursor with filters',
  )
  t.equal((await call('GET', '/v1/groups/log/deliveries')).json.deliveries.length, 27, 'limit defaults to 100')
})

t.test('bad requests', async (t) => {
  const bad: [string, number, string][] = [
    ['/v1/groups/log/deliveries?cursor=garbage', 400, 'invalid_cursor'],
    [`/v1/groups/log/deliveries?cursor=${Buffer.from('yesterday abc').toString('base64url')}`, 400, 'invalid_cursor'],
    [`/v1/groups/log/deliveries?cursor=${Buffer.from('2026-01-01T00:00:00.000Z').toString('base64url')}`, 400, 'invalid_cursor'],
    ['/v1/groups/log/deliveries?outcome=lost', 400, 'invalid_request'],
    ['/v1/groups/log/deliveries?limit=0', 400, 'invalid_request'],
    ['/v1/groups/log/deliveries?limit=1001', 400, 'invalid_request'],
    ['/v1/groups/log/deliveries?partition=-1', 400, 'invalid_request'],
    ['/v1/groups/log/deliveries?sort=asc', 400, 'invalid_request'],
    ['/v1/groups/nope/deliveries', 404, 'group_not_found'],
  ]
  for (const [url, status, code] of bad) {
    const res = await call('GET', url)
    t.equal(res.status, status, url)
    t.equal(res.json.code, code, url)
  }
  t.same(
    (await call('GET', '/v1/groups/log/deliveries?limit=1000&partition=7')).json,
    { deliveries: [], nextCursor: null },
    'no attempts on that partition',
  )
})

import t from '../helpers/tap.ts'
import { assignPartitions } from '../../src/core/consumer-assignment.ts'
import { startBroker } from '../helpers/broker.ts'

const broker = await startBroker(t)
const app = broker.app
const json = (method: string, url: string, payload?: unknown) =>
  app.inject({ method: method as 'GET', url, ...(payload === undefined ? {} : { payload: payload as object }) })

await json('PUT', '/v1/topics/orders', { partitions: 4 })
await json('PUT', '/v1/topics/orders.dlq', { partitions: 1 })

t.test('create with defaults, read back, update, and the topic is fixed', async (t) => {
  const created = await json('PUT', '/v1/groups/billing', { topic: 'orders', deadLetterTopic: 'orders.dlq' })
  t.equal(created.statusCode, 201)
  t.match(created.json(), {
    name: 'billing',
    topic: 'orders',
    ackMode: 'explicit',
    ackTimeoutMs: 30000,
    maxDeliveries: 5,
    retry: { initialDelayMs: 1000, multiplier: 2, maxDelayMs: 60000, jitter: 0.1 },
    deadLetterTopic: 'orders.dlq',
    startAt: 'earliest',
    maxInFlight: 100,
    ordered: false,
    pushTimeoutMs: 10000,
    pushFormat: 'envelope',
    paused: false,
  })
  const updated = await json('PUT', '/v1/groups/billing', { topic: 'orders', paused: true, retry: { maxDelayMs: 5000 } })
  t.equal(updated.statusCode, 200)
  t.match(
    updated.json(),
    { paused: true, retry: { initialDelayMs: 1000, maxDelayMs: 5000 }, deadLetterTopic: 'orders.dlq' },
    'fields not given keep their values',
  )
  const moved = await json('PUT', '/v1/groups/billing', { topic: 'orders.dlq' })
  t.equal(moved.statusCode, 409)
  t.equal(moved.json().code, 'group_conflict')
  const list = (await json('GET', '/v1/groups')).json()
  t.same(
    list.groups.map((g: { name: string }) => g.name),
    ['billing'],
  )
})

t.test('status: committed offsets from startAt, end offsets, lag, assignment', async (t) => {
  await json('POST', '/v1/topics/orders/messages', { messages: Array.from({ length: 8 }, (_, i) => ({ value: i, partition: i % 4 })) })
  t.equal((await json('PUT', '/v1/groups/from-start', { topic: 'orders' })).statusCode, 201)
  t.equal((await json('PUT', '/v1/groups/from-now', { topic: 'orders', startAt: 'latest' })).statusCode, 201)
  const early = (await json('GET', '/v1/groups/from-start')).json()
  t.same(
    early.partitions.map((p: { committedOffset: number; endOffset: number; lag: number }) => [p.committedOffset, p.endOffset, p.lag]),
    [
      [0, 2, 2],
      [0, 2, 2],
      [0, 2, 2],
      [0, 2, 2],
    ],
  )
  const late = (await json('GET', '/v1/groups/from-now')).json()
  t.same(
    late.partitions.map((p: { committedOffset: number; lag: number }) => [p.committedOffset, p.lag]),
    [
      [2, 0],
      [2, 0],
      [2, 0],
      [2, 0],
    ],
  )
  t.same(
    early.partitions.map((p: { consumerId: string | null }) => p.consumerId),
    [null, null, null, null],
    'no consumers yet',
  )

  const a = (await json('POST', '/v1/groups/from-start/consumers', { url: 'http://127.0.0.1:9/a' })).json()
  const b = (
    await json('POST', '/v1/groups/from-start/consumers', {
      url: 'http://127.0.0.1:9/b',
      secret: `whsec_${Buffer.alloc(24, 7).toString('base64')}`,
    })
  ).json()
  const status = (await json('GET', '/v1/groups/from-start')).json()
  t.same(
    status.partitions.map((p: { consumerId: string }) => p.consumerId),
    [a.id, b.id, a.id, b.id],
    'partitions spread over consumers',
  )
  t.same(
    status.consumers.map((c: { id: string; hasSecret: boolean }) => [c.id, c.hasSecret]),
    [
      [a.id, false],
      [b.id, true],
    ],
  )
  t.notOk(JSON.stringify(status).includes('whsec_'), 'the secret never comes back')

  t.equal((await json('DELETE', `/v1/groups/from-start/consumers/${a.id}`)).statusCode, 204)
  const after = (await json('GET', '/v1/groups/from-start')).json()
  t.same(
    after.partitions.map((p: { consumerId: string }) => p.consumerId),
    [b.id, b.id, b.id, b.id],
    "a removed consumer's partitions move",
  )
  t.equal((await json('DELETE', `/v1/groups/from-start/consumers/${a.id}`)).json().code, 'consumer_not_found')
  t.same(
    (await json('GET', '/v1/groups/from-start/consumers')).json().consumers.map((c: { id: string }) => c.id),
    [b.id],
  )
})

t.test('startAt as a timestamp', async (t) => {
  await json('PUT', '/v1/topics/timed', { partitions: 1 })
  await json('POST', '/v1/topics/timed/messages', { messages: [{ value: 'old' }] })
  await broker.db.pool.query(
    `UPDATE messages SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = messages.topic_id AND t.name = 'timed'`,
  )
  await json('POST', '/v1/topics/timed/messages', { messages: [{ value: 'new' }] })
  const since = new Date(Date.now() - 60_000).toISOString()
  t.equal((await json('PUT', '/v1/groups/timed-g', { topic: 'timed', startAt: since })).statusCode, 201)
  t.same(
    (await json('GET', '/v1/groups/timed-g')).json().partitions.map((p: { committedOffset: number }) => p.committedOffset),
    [1],
  )
})

t.test('pushTimeoutMs defaults to min(10000, ackTimeoutMs) and follows it until the caller sets it', async (t) => {
  const put = async (name: string, body: object) => {
    const res = await json('PUT', `/v1/groups/${name}`, { topic: 'orders', ...body })
    return { status: res.statusCode, body: res.json() }
  }
  const short = await put('quick', { ackTimeoutMs: 5000 })
  t.match(
    short,
    { status: 201, body: { ackTimeoutMs: 5000, pushTimeoutMs: 5000 } },
    'a short ack timeout alone is fine: the default follows it',
  )
  t.match(
    await put('quick', { ackTimeoutMs: 2000 }),
    { status: 200, body: { ackTimeoutMs: 2000, pushTimeoutMs: 2000 } },
    'and keeps following on update',
  )
  t.match(await put('quick', { ackTimeoutMs: 60000 }), { status: 200, body: { pushTimeoutMs: 10000 } }, 'up to 10000')
  t.match(
    await put('quick', { paused: true }),
    { status: 200, body: { ackTimeoutMs: 60000, pushTimeoutMs: 10000 } },
    'an unrelated update keeps both',
  )

  t.match(await put('chosen', { ackTimeoutMs: 20000, pushTimeoutMs: 8000 }), { status: 201, body: { pushTimeoutMs: 8000 } })
  t.match(
    await put('chosen', { ackTimeoutMs: 40000 }),
    { status: 200, body: { ackTimeoutMs: 40000, pushTimeoutMs: 8000 } },
    'a value the caller set stays',
  )
  const refused = await put('chosen', { ackTimeoutMs: 5000 })
  t.match(
    refused,
    {
      status: 400,
      body: { code: 'invalid_request', detail: /pushTimeoutMs \(8000\) must not exceed ackTimeoutMs \(5000\).*set explicitly/ },
    },
    'lowering ackTimeoutMs below a pushTimeoutMs the caller set is refused, not silently changed',
  )
  t.match(
    (await json('GET', '/v1/groups/chosen')).json(),
    { ackTimeoutMs: 40000, pushTimeoutMs: 8000 },
    'the refused update changed nothing',
  )
  t.match(
    await put('chosen', { ackTimeoutMs: 5000, pushTimeoutMs: 4000 }),
    { status: 200, body: { pushTimeoutMs: 4000 } },
    'both together are fine',
  )
  t.match(
    await put('chosen', { pushTimeoutMs: null }),
    { status: 200, body: { ackTimeoutMs: 5000, pushTimeoutMs: 5000 } },
    'null returns to the default',
  )
  t.match(await put('chosen', { ackTimeoutMs: 30000 }), { status: 200, body: { pushTimeoutMs: 10000 } }, 'which follows ackTimeoutMs again')

  t.match(
    await put('too-long', { ackTimeoutMs: 5000, pushTimeoutMs: 6000 }),
    { status: 400, body: { detail: /pushTimeoutMs \(6000\) must not exceed ackTimeoutMs \(5000\)/ } },
    "a value given with a shorter ack timeout is the caller's error",
  )
  t.equal((await json('GET', '/v1/groups/too-long')).statusCode, 404)
  for (const name of ['quick', 'chosen']) await json('DELETE', `/v1/groups/${name}`)
})

t.test('bad input: problem details, nothing written', async (t) => {
  const bad: [string, unknown, number, string][] = [
    ['nope', { topic: 'missing-topic' }, 404, 'topic_not_found'],
    ['nope', { topic: 'orders', deadLetterTopic: 'missing' }, 404, 'topic_not_found'],
    ['nope', { topic: 'orders', deadLetterTopic: 'orders' }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', ackMode: 'sometimes' }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', startAt: 'yesterday' }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', pushTimeoutMs: 60000 }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', retry: { initialDelayMs: 10, maxDelayMs: 5 } }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', retry: { extra: 1 } }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', maxInFlight: 0 }, 400, 'invalid_request'],
    ['nope', { topic: 'orders', unknown: true }, 400, 'invalid_request'],
    ['bad name', { topic: 'orders' }, 400, 'invalid_request'],
  ]
  for (const [name, body, status, code] of bad) {
    const res = await json('PUT', `/v1/groups/${encodeURIComponent(name)}`, body)
    t.equal(res.statusCode, status, JSON.stringify(body))
    t.equal(res.json().code, code, JSON.stringify(body))
  }
  t.equal((await json('GET', '/v1/groups/nope')).json().code, 'group_not_found')
  const consumers: [unknown, string][] = [
    [{ url: 'ftp://127.0.0.1/x' }, 'ftp'],
    [{ url: 'not a url' }, 'not a url'],
    [{ url: 'http://user:pw@127.0.0.1/x' }, 'credentials in the url'],
    [{ url: 'http://127.0.0.1/x', secret: 'plain' }, 'secret without whsec_'],
  ]
  for (const [body, what] of consumers) {
    t.equal((await json('POST', '/v1/groups/billing/consumers', body)).statusCode, 400, what)
  }
  t.equal((await json('POST', '/v1/groups/nope/consumers', { url: 'http://127.0.0.1:9/' })).statusCode, 404)
  t.same((await json('GET', '/v1/groups/billing/consumers')).json().consumers, [])
})

t.test('delete: the group goes with its consumers and offsets; a deleted topic takes the offsets', async (t) => {
  await json('PUT', '/v1/groups/temp', { topic: 'orders' })
  await json('POST', '/v1/groups/temp/consumers', { url: 'http://127.0.0.1:9/' })
  t.equal((await json('DELETE', '/v1/groups/temp')).statusCode, 204)
  t.equal((await json('GET', '/v1/groups/temp')).statusCode, 404)
  t.equal((await json('DELETE', '/v1/groups/temp')).statusCode, 404)
  const { rows } = await broker.db.pool.query(
    `SELECT (SELECT count(*) FROM consumers c LEFT JOIN consumer_groups g ON g.id = c.group_id WHERE g.id IS NULL)::int AS orphans`,
  )
  t.equal(rows[0].orphans, 0)

  await json('PUT', '/v1/topics/gone', { partitions: 2 })
  await json('PUT', '/v1/groups/on-gone', { topic: 'gone' })
  await json('DELETE', '/v1/topics/gone')
  const status = (await json('GET', '/v1/groups/on-gone')).json()
  t.same(status.partitions, [], 'no partitions while the topic is gone')
  await json('PUT', '/v1/topics/gone', { partitions: 3 })
  const again = (await json('GET', '/v1/groups/on-gone')).json()
  t.same(
    again.partitions.map((p: { committedOffset: number }) => p.committedOffset),
    [0, 0, 0],
    'a recreated topic starts the group afresh',
  )
})

t.test('assignment is a pure function of the enabled consumers', async (t) => {
  const c = (id: string, disabled = false) => ({ id, disabledAt: disabled ? new Date() : null })
  t.same(assignPartitions(3, []), [null, null, null])
  t.same(assignPartitions(5, [c('a'), c('b')]), ['a', 'b', 'a', 'b', 'a'])
  t.same(assignPartitions(2, [c('a'), c('x', true), c('b')]), ['a', 'b'], 'disabled consumers get nothing')
})

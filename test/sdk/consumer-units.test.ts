/**
 * The consumer helper's parts that need no broker: configuration errors, `handle` answers in auto
 * mode (which never calls the API), the node:http listener's limits, push parsing in both formats,
 * and the bounded in-memory idempotency store with its TTL.
 */
import t from '../helpers/tap.ts'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { createConsumer, parsePush, PushParseError, MemoryIdempotencyStore } from '@hookq/client/consumer'
import type { ConsumerErrorStage, ConsumerOptions } from '@hookq/client/consumer'
import { signedPush } from '../helpers/push.ts'

const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`

function envelope(over: Record<string, unknown> = {}): string {
  return JSON.stringify({
    deliveryId: 'd-1',
    topic: 'orders',
    group: 'billing',
    partition: 2,
    offset: 41,
    key: 'user-42',
    value: { n: 1 },
    headers: { a: 'b' },
    attempt: 3,
    timestamp: '2026-11-30T06:00:00.000Z',
    ackDeadline: '2026-11-30T06:00:30.000Z',
    ...over,
  })
}

/** A push of `body` signed with `secret` now, as the broker sends it. */
const signed = (body: string, id = 'msg_1_2_41') => signedPush(body, secret, id)

/** An auto-mode consumer (no API calls) recording its handler runs and reported errors. */
function autoConsumer(over: Partial<ConsumerOptions> = {}) {
  const runs: unknown[] = []
  const errors: { stage: ConsumerErrorStage; error: unknown }[] = []
  const consumer = createConsumer({
    secret,
    ackMode: 'auto',
    handler: (m) => {
      runs.push(m.value)
    },
    onError: (error, { stage }) => {
      errors.push({ stage, error })
    },
    ...over,
  })
  return { consumer, runs, errors }
}

t.test('configuration mistakes throw at creation', async (t) => {
  const handler = () => {}
  t.throws(() => createConsumer({ secret } as unknown as ConsumerOptions), { name: 'TypeError', message: /handler/ })
  t.throws(() => createConsumer({ handler }), { name: 'TypeError', message: /unsigned: true/ }, 'no secret, as when an env var is unset')
  t.throws(() => createConsumer({ handler, secret: [] }), TypeError)
  t.throws(() => createConsumer({ handler, secret: 'whsec_***' }), TypeError)
  t.throws(() => createConsumer({ handler, secret, ackMode: 'manual' as 'auto' }), TypeError)
  t.throws(() => createConsumer({ handler, secret, maxBodyBytes: 0 }), TypeError)
  t.doesNotThrow(() => createConsumer({ handler, unsigned: true, ackMode: 'auto' }))
})

t.test('handle in auto mode: the answer for each case', async (t) => {
  const { consumer, runs, errors } = autoConsumer({ group: 'billing' })
  t.match(await consumer.handle(signed(envelope())), {
    status: 200,
    body: '{"outcome":"handled"}',
    headers: { 'content-type': 'application/json' },
  })
  t.same(runs, [{ n: 1 }])
  t.match(await consumer.handle(signed(envelope({ group: 'shipping' }))), { status: 400, body: /wrong_group/ })
  t.match(await consumer.handle(signed('not json')), { status: 400, body: /invalid_push/ })
  t.match(await consumer.handle({ ...signed(envelope()), body: envelope({ offset: 42 }) }), { status: 401, body: /bad_signature/ })
  t.equal(runs.length, 1, 'none of those ran the handler')
  t.same(
    errors.map((e) => e.stage),
    ['parse', 'parse', 'verify'],
  )

  const small = autoConsumer({ maxBodyBytes: 100 })
  t.match(await small.consumer.handle(signed(envelope({ value: 'x'.repeat(200) }))), { status: 413 })
  t.equal(small.runs.length, 0)

  const open = autoConsumer({ secret: undefined, unsigned: true })
  t.match(
    await open.consumer.handle({ headers: { 'webhook-id': 'msg_1_0_0' }, body: envelope() }),
    { status: 200 },
    'unsigned: true takes unsigned pushes',
  )
  t.match(await open.consumer.handle({ headers: {}, body: envelope() }), { status: 400, body: /webhook-id/ })
})

t.test('a failing handler: 500, or 503 with Retry-After when a delay is chosen', async (t) => {
  const fail = () => {
    throw new Error('x'.repeat(500))
  }
  const plain = autoConsumer({ handler: fail })
  const r = await plain.consumer.handle(signed(envelope()))
  t.equal(r.status, 500)
  t.same(JSON.parse(r.body), { error: 'handler_failed' }, 'by default the error text stays out of the answer (and the attempt log)')
  t.same(
    plain.errors.map((e) => e.stage),
    ['handler'],
  )
  t.match(plain.errors[0]!.error, { message: 'x'.repeat(500) }, 'onError gets the whole error')

  const exposed = autoConsumer({ handler: fail, exposeErrors: true })
  const e = await exposed.consumer.handle(signed(envelope()))
  t.equal(e.status, 500)
  t.same(JSON.parse(e.body), { error: 'handler_failed', detail: 'x'.repeat(200) }, 'exposeErrors: the message, cut to 200 characters')

  const chosen = autoConsumer({ handler: fail, nackDelayMs: (_err, m) => m.attempt * 1500 })
  t.match(
    await chosen.consumer.handle(signed(envelope())),
    { status: 503, headers: { 'retry-after': '5' } },
    'attempt 3: 4500 ms, rounded up to 5 s',
  )

  const wrong = autoConsumer({ handler: fail, nackDelayMs: -1 })
  t.match(await wrong.consumer.handle(signed(envelope())), { status: 500 })
  t.same(
    wrong.errors.map((e) => e.stage),
    ['handler', 'internal'],
    'a bad delay is reported and the backoff used',
  )
})

t.test('idempotency store failures', async (t) => {
  const down = autoConsumer({
    idempotency: {
      has: async () => {
        throw new Error('redis down')
      },
      add: () => {},
    },
  })
  t.match(await down.consumer.handle(signed(envelope())), { status: 503, body: /idempotency_store_failed/ })
  t.equal(down.runs.length, 0, 'not run when we cannot tell whether it already was')

  const added: string[] = []
  const readOnly = autoConsumer({
    idempotency: {
      has: () => false,
      add: (id) => {
        added.push(id)
        throw new Error('read-only')
      },
    },
  })
  t.match(await readOnly.consumer.handle(signed(envelope())), { status: 200 }, 'handled: settled all the same')
  t.same(added, ['billing/msg_1_2_41'], 'the key names the group and the webhook-id')
  t.same(
    readOnly.errors.map((e) => e.stage),
    ['idempotency'],
  )

  const store = new MemoryIdempotencyStore()
  const once = autoConsumer({ idempotency: store })
  t.match(await once.consumer.handle(signed(envelope())), { status: 200, body: '{"outcome":"handled"}' })
  t.match(await once.consumer.handle(signed(envelope({ attempt: 4, deliveryId: 'd-2' }))), { status: 200, body: '{"outcome":"duplicate"}' })
  t.match(
    await once.consumer.handle(signed(envelope({ group: 'other' }))),
    { status: 200, body: '{"outcome":"handled"}' },
    'another group is another key',
  )
  t.equal(once.runs.length, 2)
})

t.test('the node:http listener: POST only, body limit while streaming', async (t) => {
  const { consumer, runs } = autoConsumer({ maxBodyBytes: 1000 })
  const server = http.createServer(consumer.listener)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  )
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/any/path`

  const get = await fetch(base)
  t.equal(get.status, 405)
  t.equal(get.headers.get('allow'), 'POST')
  const push = signed(envelope())
  t.equal((await fetch(base, { method: 'POST', headers: push.headers, body: push.body })).status, 200)
  t.equal((await fetch(base, { method: 'POST', headers: push.headers, body: 'x'.repeat(2000) })).status, 413, 'declared too long')
  // No content-length: the limit applies while the chunks arrive.
  const chunks = new ReadableStream<Uint8Array>({
    start(c) {
      for (let i = 0; i < 5; i++) c.enqueue(new TextEncoder().encode('x'.repeat(400)))
      c.close()
    },
  })
  const streamed = await fetch(base, { method: 'POST', headers: push.headers, body: chunks, duplex: 'half' } as RequestInit)
  t.equal(streamed.status, 413, 'streamed past the limit')
  t.equal(runs.length, 1)
})

t.test('parsePush: the trace context of the attempt, from the envelope or the headers', async (t) => {
  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01'
  const body = JSON.stringify({ ...JSON.parse(envelope()), traceparent: tp, tracestate: 'a=1' })
  t.match(parsePush({ headers: { 'webhook-id': 'x' }, body }), { traceparent: tp, tracestate: 'a=1' })
  const none = parsePush({
    headers: { 'webhook-id': 'x' },
    body: JSON.stringify({ ...JSON.parse(envelope()), traceparent: tp, tracestate: '' }),
  })
  t.equal(none.tracestate, undefined, 'an empty tracestate is none')
  const raw = parsePush({
    headers: {
      'webhook-id': 'x',
      'hookq-topic': 'orders',
      'hookq-group': 'billing',
      'hookq-partition': '0',
      'hookq-offset': '5',
      'hookq-delivery-id': 'd-9',
      'hookq-attempt': '1',
      'hookq-timestamp': '2026-11-30T06:00:00.000Z',
      'hookq-ack-deadline': '2026-11-30T06:00:30.000Z',
      traceparent: tp,
    },
    body: '1',
  })
  t.equal(raw.traceparent, tp)
})

t.test('parsePush: both formats, and what is refused', async (t) => {
  const m = parsePush({ headers: { 'webhook-id': 'msg_1_2_41' }, body: Buffer.from(envelope()) })
  t.same(m, {
    deliveryId: 'd-1',
    webhookId: 'msg_1_2_41',
    topic: 'orders',
    group: 'billing',
    partition: 2,
    offset: 41,
    key: 'user-42',
    value: { n: 1 },
    headers: { a: 'b' },
    attempt: 3,
    timestamp: new Date('2026-11-30T06:00:00.000Z'),
    ackDeadline: new Date('2026-11-30T06:00:30.000Z'),
    format: 'envelope',
  })
  const raw = parsePush({
    headers: {
      'webhook-id': 'msg_1_0_5',
      'hookq-topic': 'orders',
      'hookq-group': 'billing',
      'hookq-partition': '0',
      'hookq-offset': '5',
      'hookq-delivery-id': 'd-9',
      'hookq-attempt': '1',
      'hookq-timestamp': '2026-11-30T06:00:00.000Z',
      'hookq-ack-deadline': '2026-11-30T06:00:30.000Z',
      'hookq-key': '"cl\\u00e9"',
      'hookq-headers': '{"h":"v\\u00fc"}',
    },
    body: '[1,"two"]',
  })
  t.match(raw, { format: 'raw', key: 'clé', headers: { h: 'vü' }, value: [1, 'two'], partition: 0, offset: 5, deliveryId: 'd-9' })

  const refused: [string, Record<string, unknown>][] = [
    ['an array', { __body: '[]' }],
    ['no deliveryId', { deliveryId: undefined }],
    ['a negative partition', { partition: -1 }],
    ['a fractional offset', { offset: 1.5 }],
    ['a bad timestamp', { timestamp: 'yesterday' }],
    ['a numeric key', { key: 5 }],
    ['non-string headers', { headers: { a: 1 } }],
    ['no value', { value: undefined }],
  ]
  for (const [what, over] of refused) {
    const body = typeof over.__body === 'string' ? over.__body : envelope(over)
    t.throws(() => parsePush({ headers: { 'webhook-id': 'x' }, body }), PushParseError, what)
  }
  t.throws(
    () => parsePush({ headers: { 'webhook-id': 'x', 'hookq-topic': 'orders' }, body: '1' }),
    { message: /hookq-delivery-id/ },
    'raw without its headers',
  )
})

t.test('MemoryIdempotencyStore: TTL and bound, oldest first', async (t) => {
  let nowMs = 0
  const store = new MemoryIdempotencyStore({ maxEntries: 3, ttlMs: 1000, now: () => nowMs })
  store.add('a')
  nowMs = 500
  store.add('b')
  t.ok(store.has('a') && store.has('b'))
  nowMs = 1000
  t.notOk(store.has('a'), 'a expired at its TTL')
  t.ok(store.has('b'))
  store.add('b') // refreshed: now expires at 2000
  nowMs = 1600
  t.ok(store.has('b'), 'a repeated add refreshes the TTL')
  store.add('c')
  store.add('d')
  store.add('e')
  t.equal(store.size, 3)
  t.notOk(store.has('b'), 'the oldest is forgotten past maxEntries')
  t.ok(store.has('c') && store.has('d') && store.has('e'))
  t.throws(() => new MemoryIdempotencyStore({ maxEntries: 0 }), RangeError)
  t.throws(() => new MemoryIdempotencyStore({ ttlMs: 0 }), RangeError)
})

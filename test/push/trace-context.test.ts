/**
 * Trace context (contract v1.2 "Trace context") against a real broker, PostgreSQL and receivers:
 * the produce call's traceparent and a message's own (which wins), invalid ones ignored, a trace
 * of its own for a message without; every attempt in the message's trace with a span id of its
 * own, in the header and the envelope; batches, raw pushes, hookq_produce and dead letters. Last,
 * with an OpenTelemetry SDK registered, the spans the broker records.
 */
import t from '../helpers/tap.ts'
import { SpanKind, SpanStatusCode, trace } from '@opentelemetry/api'
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace'
import { readForDispatch } from '../../src/store/consumption.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import type { Envelope } from '../helpers/push-group.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, sql, allCompleted } = api(broker)

const CALL_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736'
const CALL = `00-${CALL_TRACE}-00f067aa0ba902b7-01`
const OWN_TRACE = 'a3ce929d0e0e47364bf92f3577b34da6'
const OWN = `00-${OWN_TRACE}-b7ad6b7169203331-00`
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** The parts of a traceparent (the test fails on an invalid one). */
function parts(tp: unknown): { traceId: string; spanId: string; flags: string } {
  const m = TRACEPARENT.exec(String(tp))
  if (!m) throw new Error(`not a version 00 traceparent: ${String(tp)}`)
  return { traceId: m[1]!, spanId: m[2]!, flags: m[3]! }
}

async function topicAndGroup(name: string, group: object, receiverUrl: string, partitions = 1): Promise<void> {
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  const res = await call('PUT', `/v1/groups/${name}-g`, { topic: name, ...group })
  t.equal(res.status, 201, JSON.stringify(res.json))
  t.equal((await call('POST', `/v1/groups/${name}-g/consumers`, { url: receiverUrl })).status, 201)
}

/** Produces with HTTP headers of the call (inject, so any header can be sent). */
async function produce(topic: string, messages: unknown[], headers: Record<string, string> = {}) {
  const res = await broker.app.inject({ method: 'POST', url: `/v1/topics/${topic}/messages`, payload: { messages }, headers })
  t.equal(res.statusCode, 201, res.body)
}

const byValue = (requests: Received[]) => new Map(requests.map((r) => [(r.json as Envelope).value, r]))

t.test("the call's traceparent, a message's own (first), invalid ones ignored, a trace of its own otherwise", async (t) => {
  const receiver = await startReceiver(t)
  await topicAndGroup('tc1', { ackMode: 'auto' }, receiver.url)
  await produce(
    'tc1',
    [
      { value: 1 },
      { value: 2, headers: { traceparent: OWN, tracestate: 'own=1' } },
      { value: 3, headers: { traceparent: CALL.toUpperCase(), tracestate: 'own=3' } },
    ],
    { traceparent: CALL, tracestate: 'call=1,other=x' },
  )
  await produce('tc1', [{ value: 4 }, { value: 5 }])
  await produce('tc1', [{ value: 6 }], { traceparent: `00-${'0'.repeat(32)}-00f067aa0ba902b7-01`, tracestate: 'call=6' })
  const got = byValue(await receiver.waitFor(6))

  const pushOf = (v: number) => {
    const r = got.get(v)!
    const env = r.json as Envelope
    t.equal(env.traceparent, r.headers.traceparent, `${v}: the envelope carries the header's traceparent`)
    return { r, env, tp: parts(r.headers.traceparent) }
  }
  const one = pushOf(1)
  t.equal(one.tp.traceId, CALL_TRACE, "1: the call's trace")
  t.not(one.tp.spanId, '00f067aa0ba902b7', "1: a span id of its own, never the producer's")
  t.equal(one.tp.flags, '01', "1: the producer's flags")
  t.equal(one.r.headers.tracestate, 'call=1,other=x')
  t.equal(one.env.tracestate, 'call=1,other=x')
  t.same(one.env.headers, {}, "the call's context is not added to the message's headers")

  const two = pushOf(2)
  t.equal(two.tp.traceId, OWN_TRACE, "2: its own traceparent wins over the call's")
  t.equal(two.tp.flags, '00', '2: its own flags (not sampled)')
  t.equal(two.r.headers.tracestate, 'own=1', '2: with its own tracestate')
  t.equal(two.env.headers.traceparent, OWN, '2: its headers stay as produced')

  const three = pushOf(3)
  t.equal(three.tp.traceId, CALL_TRACE, "3: an invalid own traceparent (upper case) is ignored: the call's")
  t.equal(three.r.headers.tracestate, 'call=1,other=x', "3: and the call's tracestate with it")

  const four = pushOf(4)
  const five = pushOf(5)
  t.not(four.tp.traceId, five.tp.traceId, '4, 5: each a trace of its own')
  t.equal(four.tp.flags, '01', 'a trace begun by hookq is sampled')
  t.equal(four.r.headers.tracestate, undefined, 'no tracestate header without one')
  t.equal(four.env.tracestate, '', 'the envelope says "" for none')
  const six = pushOf(6)
  t.not(six.tp.traceId, '0'.repeat(32), '6: an all-zero trace id is ignored')
  t.equal(six.r.headers.tracestate, undefined, "6: the invalid call's tracestate goes with it")

  const stored = await sql(
    `SELECT m.value, replace(m.trace_id::text, '-', '') AS trace_id, m.traceparent, m.tracestate FROM messages m
     JOIN topics t ON t.id = m.topic_id WHERE t.name = 'tc1' ORDER BY m."offset"`,
  )
  t.same(
    stored.map((r) => [JSON.parse(r.value), r.trace_id, r.traceparent, r.tracestate]),
    [
      [1, CALL_TRACE, CALL, 'call=1,other=x'],
      [2, OWN_TRACE, OWN, 'own=1'],
      [3, CALL_TRACE, CALL, 'call=1,other=x'],
      [4, four.tp.traceId, null, null],
      [5, five.tp.traceId, null, null],
      [6, six.tp.traceId, null, null],
    ],
    'the trace is stored with each message',
  )
})

t.test('retries keep the trace with a new span id each; the dead letter keeps the trace', async (t) => {
  const receiver = await startReceiver(t)
  receiver.setBehaviour({ status: 500 })
  t.equal((await call('PUT', '/v1/topics/tc2.dlq', { partitions: 1 })).status, 201)
  await topicAndGroup(
    'tc2',
    { ackMode: 'auto', maxDeliveries: 3, deadLetterTopic: 'tc2.dlq', retry: { initialDelayMs: 20, maxDelayMs: 20, jitter: 0 } },
    receiver.url,
  )
  await produce('tc2', [{ value: 'a' }, { value: 'b' }], { traceparent: CALL })
  await allCompleted('tc2-g')
  for (const v of ['a', 'b']) {
    const pushes = receiver.requests.filter((r) => (r.json as Envelope).value === v)
    t.same(pushes.map((r) => (r.json as Envelope).attempt).sort(), [1, 2, 3], `${v}: three attempts`)
    const tps = pushes.map((r) => parts(r.headers.traceparent))
    t.ok(
      tps.every((p) => p.traceId === CALL_TRACE),
      `${v}: every attempt in the message's trace`,
    )
    t.equal(new Set(tps.map((p) => p.spanId)).size, 3, `${v}: a span id of its own per attempt`)
  }
  const dead = await sql(
    `SELECT replace(m.trace_id::text, '-', '') AS trace_id, m.traceparent FROM messages m
     JOIN topics t ON t.id = m.topic_id WHERE t.name = 'tc2.dlq' ORDER BY m."offset"`,
  )
  t.same(dead, [
    { trace_id: CALL_TRACE, traceparent: CALL },
    { trace_id: CALL_TRACE, traceparent: CALL },
  ])

  // A message that had no trace context keeps the one it got through its dead letter too.
  const before = receiver.requests.length
  await produce('tc2', [{ value: 'c' }])
  await allCompleted('tc2-g')
  const c = receiver.requests.slice(before).map((r) => parts(r.headers.traceparent).traceId)
  t.equal(c.length, 3)
  t.equal(new Set(c).size, 1, 'the same trace id for all attempts of a message without one')
  const [last] = await sql(
    `SELECT replace(m.trace_id::text, '-', '') AS trace_id FROM messages m
     JOIN topics t ON t.id = m.topic_id WHERE t.name = 'tc2.dlq' ORDER BY m."offset" DESC LIMIT 1`,
  )
  t.equal(last.trace_id, c[0], 'and its dead letter keeps it')
})

t.test("batch pushes: each envelope its message's trace; the header the first one's", async (t) => {
  const receiver = await startReceiver(t)
  await topicAndGroup('tc3', { ackMode: 'auto', batch: { maxMessages: 10, maxWaitMs: 200 } }, receiver.url)
  const own = (i: number) => `00-${String(i).repeat(32)}-b7ad6b716920333${i}-01`
  await produce(
    'tc3',
    [1, 2, 3, 4].map((i) => ({ value: i, headers: { traceparent: own(i), tracestate: `m=${i}` } })),
  )
  await allCompleted('tc3-g')
  const seen: number[] = []
  for (const r of receiver.requests) {
    const deliveries = (r.json as { deliveries: Envelope[] }).deliveries
    for (const d of deliveries) {
      const tp = parts(d.traceparent)
      t.equal(tp.traceId, String(d.value).repeat(32), `${String(d.value)}: its own trace in its envelope`)
      t.not(tp.spanId, `b7ad6b716920333${String(d.value)}`)
      t.equal(d.tracestate, `m=${String(d.value)}`)
      seen.push(d.value as number)
    }
    t.equal(r.headers.traceparent, deliveries[0]!.traceparent, "the request's header: its first message's attempt")
    t.equal(r.headers.tracestate, deliveries[0]!.tracestate)
  }
  t.same(seen.sort(), [1, 2, 3, 4])
})

t.test('raw format: the trace in headers', async (t) => {
  const receiver = await startReceiver(t)
  await topicAndGroup('tc4', { ackMode: 'auto', pushFormat: 'raw' }, receiver.url)
  await produce('tc4', [{ value: { raw: true } }], { traceparent: CALL, tracestate: 'call=1' })
  const [r] = await receiver.waitFor(1)
  t.same(r!.json, { raw: true }, 'the bare value')
  t.equal(parts(r!.headers.traceparent).traceId, CALL_TRACE)
  t.equal(r!.headers.tracestate, 'call=1')
})

t.test("hookq_produce: the traceparent in its headers argument; none: a trace of the message's own", async (t) => {
  const receiver = await startReceiver(t)
  await topicAndGroup('tc5', { ackMode: 'auto' }, receiver.url)
  await broker.db.pool.query(`SELECT hookq_produce('tc5', '"sql-1"', NULL, $1)`, [
    JSON.stringify({ traceparent: OWN, tracestate: 'sql=1' }),
  ])
  await broker.db.pool.query(`SELECT hookq_produce('tc5', '"sql-2"')`)
  const got = byValue(await receiver.waitFor(2, 20_000))
  const first = got.get('sql-1')!
  t.equal(parts(first.headers.traceparent).traceId, OWN_TRACE)
  t.equal(first.headers.tracestate, 'sql=1')
  t.match(parts(got.get('sql-2')!.headers.traceparent).traceId, /^[0-9a-f]{32}$/)
  t.not(parts(got.get('sql-2')!.headers.traceparent).traceId, OWN_TRACE)
})

t.test('a message stored before trace ids were kept gets one derived from it, the same at every read', async (t) => {
  t.equal((await call('PUT', '/v1/topics/tc7', { partitions: 1 })).status, 201)
  const [{ id }] = await sql(`SELECT id FROM topics WHERE name = 'tc7'`)
  await sql(`UPDATE topic_partitions SET next_offset = 1 WHERE topic_id = $1`, [id])
  await sql(`INSERT INTO messages (topic_id, partition, "offset", value, headers) VALUES ($1, 0, 0, '"old"', '{}')`, [id])
  const read = async () => (await readForDispatch(broker.db.pool, [{ topicId: id, partition: 0, fromOffset: 0 }], 10))[0]![0]!
  const first = await read()
  t.match(first, { value: '"old"', traceparent: null, tracestate: null })
  t.match(first.traceId, /^[0-9a-f]{32}$/)
  t.equal((await read()).traceId, first.traceId, 'stable across reads (and so across attempts and processes)')
})

t.test('with an OpenTelemetry SDK: produce, push attempts (outcome, status), ack, nack and dead-letter spans', async (t) => {
  const exporter = new InMemorySpanExporter()
  const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] })
  t.ok(trace.setGlobalTracerProvider(provider), 'registered')
  t.teardown(() => trace.disable())

  const receiver = await startReceiver(t)
  // The first push of each message fails (503), the second is answered 200 and waits for an ack.
  const tries = new Map<unknown, number>()
  receiver.setBehaviour((req) => {
    const v = (req.json as Envelope).value
    tries.set(v, (tries.get(v) ?? 0) + 1)
    return { status: tries.get(v) === 1 ? 503 : 200 }
  })
  t.equal((await call('PUT', '/v1/topics/tc6.dlq', { partitions: 1 })).status, 201)
  await topicAndGroup(
    'tc6',
    { ackMode: 'explicit', deadLetterTopic: 'tc6.dlq', retry: { initialDelayMs: 20, maxDelayMs: 20, jitter: 0 } },
    receiver.url,
  )
  await produce('tc6', [{ value: 'ack me' }, { value: 'dead-letter me' }], { traceparent: CALL })
  await waitUntil(() => receiver.requests.length >= 4, 10_000, 'two attempts each')
  const second = (v: string) => receiver.requests.find((r) => (r.json as Envelope).value === v && (r.json as Envelope).attempt === 2)!
  t.same(
    (await call('POST', '/v1/groups/tc6-g/acks', { deliveryIds: [(second('ack me').json as Envelope).deliveryId] })).json.results[0].status,
    'acked',
  )
  t.same(
    (
      await call('POST', '/v1/groups/tc6-g/nacks', {
        deliveryIds: [(second('dead-letter me').json as Envelope).deliveryId],
        deadLetter: true,
      })
    ).json.results[0].status,
    'nacked',
  )
  await allCompleted('tc6-g')
  await waitUntil(() => exporter.getFinishedSpans().some((s) => s.name === 'dead_letter tc6'), 10_000, 'the dead-letter span')

  const spans = exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === CALL_TRACE)
  const named = (name: string) => spans.filter((s) => s.name === name)
  const parentOf = (s: (typeof spans)[number]) => s.parentSpanContext?.spanId

  const [send] = named('send tc6')
  t.equal(send?.kind, SpanKind.PRODUCER, 'produce: a PRODUCER span')
  t.equal(parentOf(send!), '00f067aa0ba902b7', "a child of the call's traceparent")
  t.match(send!.attributes, { 'messaging.system': 'hookq', 'messaging.destination.name': 'tc6', 'messaging.batch.message_count': 2 })

  const pushes = named('push tc6')
  t.equal(pushes.length, 4, 'one span per push attempt')
  const sentSpanIds = receiver.requests.map((r) => parts(r.headers.traceparent).spanId).sort()
  t.same(pushes.map((s) => s.spanContext().spanId).sort(), sentSpanIds, "each push's traceparent names its span")
  for (const s of pushes) {
    t.equal(s.kind, SpanKind.CLIENT)
    t.equal(parentOf(s), '00f067aa0ba902b7', "a child of the message's creation context")
    const status = s.attributes['http.response.status_code']
    t.equal(s.status.code, status === 503 ? SpanStatusCode.ERROR : SpanStatusCode.UNSET, `status ${String(status)}`)
    t.match(s.attributes, {
      'messaging.operation.type': 'send',
      'messaging.consumer.group.name': 'tc6-g',
      'hookq.push.outcome': /^(delivered|rejected)$/,
    })
  }
  t.same(pushes.map((s) => s.attributes['http.response.status_code']).sort(), [200, 200, 503, 503])

  t.match(named('ack tc6'), [{ kind: SpanKind.CLIENT, attributes: { 'messaging.operation.type': 'settle', 'hookq.attempt': 2 } }])
  t.match(named('nack tc6'), [{ kind: SpanKind.CLIENT, attributes: { 'messaging.operation.type': 'settle' } }])
  t.match(named('dead_letter tc6'), [{ kind: SpanKind.PRODUCER, attributes: { 'messaging.destination.name': 'tc6.dlq' } }])
})

t.test('with an OpenTelemetry SDK: a pull lease is a `pull` span in the message trace, named by the envelope', async (t) => {
  const exporter = new InMemorySpanExporter()
  const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] })
  t.ok(trace.setGlobalTracerProvider(provider), 'registered')
  t.teardown(() => trace.disable())
  t.equal((await call('PUT', '/v1/topics/tc8', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/tc8-g', { topic: 'tc8', delivery: 'pull' })).status, 201)
  await produce('tc8', [{ value: 'pull me' }], { traceparent: CALL })
  const pulled = await call('POST', '/v1/groups/tc8-g/pull', { maxMessages: 10, waitMs: 10_000 })
  t.equal(pulled.status, 200)
  const [m] = pulled.json.messages as (Envelope & { traceparent?: string })[]
  const tp = parts(m!.traceparent)
  t.equal(tp.traceId, CALL_TRACE, "the lease is in the message's trace")
  const leases = exporter.getFinishedSpans().filter((s) => s.name === 'pull tc8')
  t.equal(leases.length, 1, 'one span for the lease')
  t.equal(leases[0]!.spanContext().spanId, tp.spanId, "the envelope's traceparent names it")
  t.equal(leases[0]!.parentSpanContext?.spanId, '00f067aa0ba902b7', "a child of the message's creation context")
  t.match(leases[0]!.attributes, {
    'messaging.operation.type': 'receive',
    'messaging.operation.name': 'pull',
    'messaging.consumer.group.name': 'tc8-g',
    'hookq.attempt': 1,
  })
})

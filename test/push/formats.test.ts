/**
 * What a push looks like and when it goes out, against the real broker: pushFormat raw and its
 * hookq-* headers, Standard Webhooks headers and signatures (checked with an HMAC written here,
 * not src's), and produce delayMs.
 */
import t from '../helpers/tap.ts'
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { env, pushGroups, timedReceiver } from '../helpers/push-group.ts'
import { inOffsetOrder, startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus, allCompleted, ack } = api(broker)
const groups = pushGroups({ call, sql })
const { topicAndGroup } = groups
const addConsumer = (group: string, url: string, secret?: string) => groups.addConsumer(group, url, secret ? { secret } : {})
const header = (r: Received, name: string) => {
  const v = r.headers[name]
  return Array.isArray(v) ? v.join(', ') : v
}

/** Standard Webhooks verification, written from the spec: HMAC-SHA256 of `${id}.${ts}.${body}` under base64-decoded key. */
function independentVerify(secret: string, r: Received): boolean {
  const id = header(r, 'webhook-id')
  const ts = header(r, 'webhook-timestamp')
  const sig = header(r, 'webhook-signature')
  if (!id || !ts || !sig) return false
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64')
  const expected = createHmac('sha256', key)
    .update(Buffer.from(`${id}.${ts}.${r.body}`, 'utf8'))
    .digest()
  return sig.split(' ').some((entry) => {
    const [version, b64] = entry.split(',')
    if (version !== 'v1' || !b64) return false
    const got = Buffer.from(b64, 'base64')
    return got.length === expected.length && timingSafeEqual(got, expected)
  })
}

t.test('pushFormat raw: the body is the bare value; hookq-* headers carry the envelope fields', async (t) => {
  await topicAndGroup(t, 'raw', { pushFormat: 'raw', ackTimeoutMs: 30_000, retry: { initialDelayMs: 50, maxDelayMs: 50, jitter: 0 } }, 2)
  const { receiver } = await timedReceiver(t)
  await addConsumer('raw-g', receiver.url)
  const value = { a: 1, b: [true, null, 'é'], s: 'x\u0000y' }
  await produce('raw', [
    { value, key: 'user-1', headers: { trace: 't1' }, partition: 1 },
    { value: 'just a string', partition: 1 },
  ])
  await receiver.waitFor(2)
  const [first, second] = inOffsetOrder(receiver.requests) as [Received, Received]
  t.same(JSON.parse(first.body), value, 'body is the value itself')
  t.notOk('deliveryId' in (JSON.parse(first.body) as object), 'no envelope around it')
  t.equal(second.body, '"just a string"', 'a string value is its JSON text')
  t.match(header(first, 'content-type'), /application\/json/)
  const id = header(first, 'hookq-delivery-id')!
  t.match(id, /^[A-Za-z0-9_-]{22,}$/, 'delivery id header')
  t.equal(header(first, 'hookq-topic'), 'raw')
  t.equal(header(first, 'hookq-partition'), '1')
  t.equal(header(first, 'hookq-offset'), '0')
  t.equal(header(second, 'hookq-offset'), '1')
  t.equal(header(first, 'hookq-attempt'), '1')
  const deadline = Date.parse(header(first, 'hookq-ack-deadline') ?? '')
  t.ok(Math.abs(deadline - (first.receivedAt + 30_000)) < 1000, 'hookq-ack-deadline is about push time + ackTimeoutMs')
  t.ok(header(first, 'webhook-id'), 'Standard Webhooks headers too')
  // The raw delivery id works like the envelope's.
  const n = await call('POST', '/v1/groups/raw-g/nacks', { deliveryIds: [id], delayMs: 0 })
  t.equal(n.json.results[0].status, 'nacked')
  await receiver.waitFor(3)
  const again = receiver.requests[2]!
  t.equal(header(again, 'hookq-attempt'), '2')
  t.equal(header(again, 'hookq-offset'), '0')
  t.not(header(again, 'hookq-delivery-id'), id)
  t.same(await ack('raw-g', [header(again, 'hookq-delivery-id')!, header(second, 'hookq-delivery-id')!]), ['acked', 'acked'])
  t.match((await groupStatus('raw-g')).partitions[1], { committedOffset: 2, lag: 0 })
})

t.test('Standard Webhooks: webhook-id stable across attempts, timestamp current, signature verifies independently', async (t) => {
  const secret = `whsec_${randomBytes(32).toString('base64')}`
  await topicAndGroup(t, 'sw', { ackMode: 'auto', retry: { initialDelayMs: 1100, maxDelayMs: 1100, jitter: 0 } })
  const { receiver } = await timedReceiver(t, (_req, n) => (n === 1 ? { status: 500 } : { status: 200 }))
  await addConsumer('sw-g', receiver.url, secret)
  const unsigned = await startReceiver(t)
  await topicAndGroup(t, 'sw2', { ackMode: 'auto' })
  await addConsumer('sw2-g', unsigned.url)
  await produce('sw', [{ value: { hello: 'wörld', n: 1.5 } }, { value: 2 }])
  await produce('sw2', [{ value: 3 }])
  await allCompleted('sw-g')
  await allCompleted('sw2-g')
  const m0 = receiver.requests.filter((r) => env(r).offset === 0)
  t.equal(m0.length, 2, 'offset 0 pushed twice (500, then 200)')
  t.equal(header(m0[0]!, 'webhook-id'), header(m0[1]!, 'webhook-id'), 'webhook-id the same for both attempts')
  const m1 = receiver.requests.find((r) => env(r).offset === 1)!
  t.not(header(m1, 'webhook-id'), header(m0[0]!, 'webhook-id'), 'another message, another webhook-id')
  for (const r of receiver.requests) {
    const ts = header(r, 'webhook-timestamp') ?? ''
    t.match(ts, /^\d+$/, 'timestamp in whole seconds')
    t.ok(Math.abs(Number(ts) - Date.now() / 1000) < 30, 'timestamp is now')
    t.match(header(r, 'webhook-signature'), /^v1,[A-Za-z0-9+/]+=*( v1,[A-Za-z0-9+/]+=*)*$/)
    t.ok(independentVerify(secret, r), `attempt ${env(r).attempt} of offset ${env(r).offset}: signature verifies`)
  }
  // The verifier is not a yes-man: another secret or a changed byte fails.
  const other = `whsec_${randomBytes(32).toString('base64')}`
  t.notOk(independentVerify(other, m1), 'another secret does not verify')
  t.notOk(independentVerify(secret, { ...m1, body: m1.body.replace('2', '3') }), 'a changed body does not verify')
  t.notOk(
    independentVerify(secret, {
      ...m1,
      headers: { ...m1.headers, 'webhook-timestamp': String(Number(header(m1, 'webhook-timestamp')) + 1) },
    }),
    'a changed timestamp does not verify',
  )
  const u = unsigned.requests[0]!
  t.ok(header(u, 'webhook-id') && header(u, 'webhook-timestamp'), 'a consumer without a secret gets id and timestamp')
  t.equal(header(u, 'webhook-signature'), undefined, 'and no signature')
})

t.test('Standard Webhooks with pushFormat raw: the signature covers the raw body', async (t) => {
  const secret = `whsec_${randomBytes(24).toString('base64')}`
  await topicAndGroup(t, 'swraw', { ackMode: 'auto', pushFormat: 'raw' })
  const r = await startReceiver(t)
  await addConsumer('swraw-g', r.url, secret)
  await produce('swraw', [{ value: ['raw', { x: 'ü' }] }])
  await r.waitFor(1)
  t.equal(r.requests[0]!.body, JSON.stringify(['raw', { x: 'ü' }]))
  t.ok(independentVerify(secret, r.requests[0]!), 'verifies over the bare value')
})

t.test('produce delayMs: not pushed before its time; undelayed neighbours are not held back', async (t) => {
  await topicAndGroup(t, 'dly', { ackMode: 'auto' })
  const arrived = new Map<string, number>()
  const r = await startReceiver(t, (req) => {
    arrived.set(String(env(req).value), Date.now())
    return { status: 200 }
  })
  await addConsumer('dly-g', r.url)
  const before = Date.now()
  await produce('dly', [{ value: 'late', delayMs: 1500 }, { value: 'now' }, { value: 'soon', delayMs: 600 }])
  await allCompleted('dly-g')
  const at = (v: string) => arrived.get(v)! - before
  t.comment(`now ${at('now')} ms, soon ${at('soon')} ms, late ${at('late')} ms after the produce call`)
  t.ok(at('now') < 1000, 'the undelayed one went out at once')
  t.ok(at('soon') >= 600 - 5 && at('soon') < 600 + 3000, 'delayMs 600 honoured')
  t.ok(at('late') >= 1500 - 5 && at('late') < 1500 + 3000, 'delayMs 1500 honoured')
})

t.test('produce delayMs: delayed messages waiting for their time do not use up maxInFlight', async (t) => {
  // maxInFlight bounds messages in flight; a delayed message not yet pushed is not in flight.
  await topicAndGroup(t, 'dlyq', { ackMode: 'auto', maxInFlight: 2 })
  const arrived = new Map<string, number>()
  const r = await startReceiver(t, (req) => {
    arrived.set(String(env(req).value), Date.now())
    return { status: 200 }
  })
  await addConsumer('dlyq-g', r.url)
  const before = Date.now()
  await produce('dlyq', [{ value: 'later-1', delayMs: 3000 }, { value: 'later-2', delayMs: 3000 }, { value: 'now' }])
  await waitUntil(() => arrived.has('now'), 30_000, 'the undelayed message')
  t.ok(arrived.get('now')! - before < 1000, `the undelayed message went out after ${arrived.get('now')! - before} ms (want < 1000)`)
  await allCompleted('dlyq-g')
})

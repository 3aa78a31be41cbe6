/**
 * The consumer helper (@hookq/client/consumer) against the real broker over HTTP, served by a real
 * node:http server (and a real Fastify app) on 127.0.0.1: the example docs/consumer-helper.md shows, run as a file, acks
 * bringing the lag to 0, a nack's delay honoured, bad signatures and stale timestamps refused
 * without running the handler, secret rotation, idempotency across a dropped ack, a seek back and
 * a push timeout, the raw format, and auto ack mode.
 */
import t from '../helpers/tap.ts'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import Fastify from 'fastify'
import { unwrap } from '@hookq/client'
import { createConsumer } from '@hookq/client/consumer'
import type { ConsumerErrorStage, PushMessage } from '@hookq/client/consumer'
import { generateSecret, signHeaders, signWebhook } from '../../src/core/signature.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { sdkApi, serve, spawnConsumer } from '../helpers/sdk.ts'
import { waitUntil } from '../helpers/wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))
const { url } = await startListeningBroker(t)
const { hookq, setup, register, produce, lagZero, deliveries, droppingAcks } = sdkApi(url)

/** Collects what the consumer reports to onError. */
function errorLog() {
  const seen: { stage: ConsumerErrorStage; error: unknown }[] = []
  return {
    seen,
    onError: (error: unknown, { stage }: { stage: ConsumerErrorStage }) => {
      seen.push({ stage, error })
    },
  }
}

/** A POST of `body` with `headers` to `target`; status and parsed answer. */
async function post(target: string, body: string, headers: Record<string, string>) {
  const res = await fetch(target, { method: 'POST', body, headers: { 'content-type': 'application/json', ...headers } })
  return { status: res.status, json: (await res.json()) as Record<string, unknown>, headers: res.headers }
}

/** A well-formed envelope push for hand-made requests. */
function envelope(group: string, over: Record<string, unknown> = {}): string {
  const now = new Date().toISOString()
  return JSON.stringify({
    deliveryId: 'hand-made',
    topic: group,
    group,
    partition: 0,
    offset: 0,
    key: null,
    value: { hand: true },
    headers: {},
    attempt: 1,
    timestamp: now,
    ackDeadline: now,
    ...over,
  })
}

t.test("docs/consumer-helper.md's complete consumer: the text of examples/consumer.mjs, run as a file", async (t) => {
  // docs/consumer-helper.md shows the file verbatim, so running the file runs what a reader copies.
  const example = await readFile(path.join(root, 'examples/consumer.mjs'), 'utf8')
  const readme = await readFile(path.join(root, 'docs/consumer-helper.md'), 'utf8')
  const shown = /<!-- examples\/consumer\.mjs -->\n```js\n([\s\S]*?)```\n/.exec(readme)?.[1]
  t.equal(shown, example, 'docs/consumer-helper.md shows examples/consumer.mjs exactly')

  await setup('readme')
  const secret = generateSecret()
  const running = await spawnConsumer(t, 'examples/consumer.mjs', { HOOKQ_URL: url, HOOKQ_WEBHOOK_SECRET: secret, PORT: '0' })
  await register('readme', running.url, secret)

  await produce('readme', [{ value: { order: 1 } }, { value: { order: 2 } }])
  await lagZero('readme')
  t.same(
    running
      .output()
      .split('\n')
      .filter((l) => l.startsWith('order '))
      .sort(),
    ['order {"order":1}', 'order {"order":2}'],
    'each value handled once (pushed in parallel: in any order)',
  )
  const log = await waitUntil(
    async () => {
      const d = await deliveries('readme')
      return d.length === 2 && d.every((x) => x.outcome === 'acked' && x.statusCode !== null) ? d : undefined
    },
    10_000,
    'two acked attempts',
  )
  t.same(
    log.map((d) => [d.offset, d.attempt, d.statusCode]),
    [
      [0, 1, 200],
      [1, 1, 200],
    ],
    'acked before the 200 answer',
  )
})

t.test('explicit mode: a throwing handler is nacked with its delay, pushed again as attempt 2, then acked', async (t) => {
  // The group's own backoff is a minute: only the nack's 300 ms can bring the message back this soon.
  await setup('nacked', { retry: { initialDelayMs: 60_000 } })
  const secret = generateSecret()
  const seen: { attempt: number; atMs: number; message: PushMessage }[] = []
  const errors = errorLog()
  const consumer = createConsumer({
    secret,
    baseUrl: url,
    group: 'nacked',
    nackDelayMs: 300,
    onError: errors.onError,
    handler(message) {
      seen.push({ attempt: message.attempt, atMs: Date.now(), message })
      if (message.attempt === 1) throw new Error('the database is down')
    },
  })
  await register('nacked', await serve(t, consumer.listener), secret)
  await produce('nacked', [{ key: 'k-1', value: { n: 1 }, headers: { trace: 'abc' } }])
  await lagZero('nacked')

  t.same(
    seen.map((s) => s.attempt),
    [1, 2],
  )
  const gapMs = seen[1]!.atMs - seen[0]!.atMs
  t.ok(gapMs >= 250 && gapMs < 30_000, `pushed again after the nack's delay, not the 60 s backoff (${gapMs} ms)`)
  const m = seen[0]!.message
  t.match(m, {
    topic: 'nacked',
    group: 'nacked',
    partition: 0,
    offset: 0,
    key: 'k-1',
    value: { n: 1 },
    headers: { trace: 'abc' },
    format: 'envelope',
  })
  t.match(m.webhookId, /^msg_\d+_0_0$/)
  t.equal(seen[1]!.message.webhookId, m.webhookId, 'the same webhook-id on every attempt')
  t.not(seen[1]!.message.deliveryId, m.deliveryId, 'a new delivery id per attempt')
  t.ok(m.timestamp instanceof Date && m.ackDeadline.getTime() > m.timestamp.getTime())
  t.same(
    errors.seen.map((e) => e.stage),
    ['handler'],
  )

  const log = await waitUntil(
    async () => {
      const d = await deliveries('nacked')
      return d.length === 2 && d[1]!.outcome === 'acked' && d.every((x) => x.statusCode !== null) ? d : undefined
    },
    10_000,
    'the attempt log settled',
  )
  // The nack settled attempt 1 before the answer: the 500 that followed is recorded, not counted
  // again (a 500, not a 503: the message failed, the consumer is not overloaded).
  t.match(log, [
    { attempt: 1, outcome: 'nacked', statusCode: 500 },
    { attempt: 2, outcome: 'acked', statusCode: 200 },
  ])
  t.notMatch(JSON.stringify(log), /the database is down/, 'the exception text stays with the consumer, out of the attempt log')
})

t.test('a wrong secret or a stale timestamp gets 401 and the handler never runs', async (t) => {
  await setup('wrongsecret', { maxDeliveries: 1 })
  const [registered, configured] = [generateSecret(), generateSecret()]
  let runs = 0
  const errors = errorLog()
  const consumer = createConsumer({
    secret: configured,
    baseUrl: url,
    onError: errors.onError,
    handler: () => {
      runs++
    },
  })
  const base = await serve(t, consumer.listener)
  await register('wrongsecret', base, registered)
  await produce('wrongsecret', [{ value: 1 }])
  await lagZero('wrongsecret') // maxDeliveries 1: the refused attempt makes it dead
  const log = await waitUntil(
    async () => {
      const d = await deliveries('wrongsecret')
      return d.length === 1 && d[0]!.outcome === 'dead' ? d : undefined
    },
    10_000,
    'the refused attempt logged',
  )
  t.match(log[0], { outcome: 'dead', statusCode: 401 })
  t.match(log[0]!.error, /invalid_signature/)

  // By hand, with the broker's own signer (not the consumer's), so both implementations must agree.
  const body = envelope('wrongsecret')
  const nowS = Math.floor(Date.now() / 1000)
  const signed = (timestampS: number, secrets = [configured], id = 'msg_hand_0_0') => ({
    'webhook-id': id,
    'webhook-timestamp': String(timestampS),
    'webhook-signature': signWebhook({ id, timestampS, body, secrets }),
    'hookq-signature': signHeaders({ id, timestampS, headers: {}, secrets }),
  })
  const stale = await post(base, body, signed(nowS - 301))
  t.match(stale, { status: 401, json: { reason: 'timestamp_out_of_tolerance' } })
  const future = await post(base, body, signed(nowS + 400))
  t.match(future, { status: 401, json: { reason: 'timestamp_out_of_tolerance' } })
  t.match(await post(base, body, signed(nowS, [registered])), { status: 401, json: { reason: 'bad_signature' } })
  t.match(await post(base, body, { 'webhook-id': 'x', 'webhook-timestamp': String(nowS) }), {
    status: 401,
    json: { reason: 'missing_headers' },
  })
  const tampered = signed(nowS)
  t.match(await post(base, body.replace('"hand":true', '"hand":false'), tampered), { status: 401, json: { reason: 'bad_signature' } })
  // Signed but not a push: 400, still without running the handler.
  const notPush = '{"hello":"world"}'
  t.match(
    await post(base, notPush, {
      'webhook-id': 'i',
      'webhook-timestamp': String(nowS),
      'webhook-signature': signWebhook({ id: 'i', timestampS: nowS, body: notPush, secrets: [configured] }),
      'hookq-signature': signHeaders({ id: 'i', timestampS: nowS, headers: {}, secrets: [configured] }),
    }),
    { status: 400, json: { error: 'invalid_push' } },
  )
  t.equal(runs, 0, 'the handler never ran')
  t.same(
    errors.seen.map((e) => e.stage),
    ['verify', 'verify', 'verify', 'verify', 'verify', 'verify', 'parse'],
  )
})

t.test('rotation: during the overlap either secret verifies', async (t) => {
  await setup('rotation')
  const [oldSecret, newSecret] = [generateSecret(), generateSecret()]
  const handled: { value: unknown; by: string }[] = []
  const signatureCounts: number[] = []
  const make = (secret: string, by: string) =>
    createConsumer({
      secret,
      baseUrl: url,
      handler: (m) => {
        handled.push({ value: m.value, by })
      },
    })
  const [withOld, withNew] = [make(oldSecret, 'old'), make(newSecret, 'new')]
  let current = withOld
  const base = await serve(t, (req, res) => {
    signatureCounts.push(String(req.headers['webhook-signature']).split(' ').length)
    current.listener(req, res)
  })
  const id = await register('rotation', base, oldSecret)
  await unwrap(
    hookq.POST('/v1/groups/{group}/consumers/{id}/secret', { params: { path: { group: 'rotation', id } }, body: { secret: newSecret } }),
  )

  await produce('rotation', [{ value: 1 }])
  await lagZero('rotation')
  current = withNew
  await produce('rotation', [{ value: 2 }])
  await lagZero('rotation')
  t.same(
    handled,
    [
      { value: 1, by: 'old' },
      { value: 2, by: 'new' },
    ],
    'a consumer on either secret accepts the pushes',
  )
  t.same(signatureCounts, [2, 2], 'each push carried both signatures')
})

t.test('idempotency: a dropped ack and a seek back redeliver, and the handler runs once', async (t) => {
  await setup('idem', { retry: { initialDelayMs: 100 } })
  const secret = generateSecret()
  // The first ack never reaches the broker (as if the network dropped it); the rest go through.
  const client = droppingAcks(1)
  let runs = 0
  let pushes = 0
  const errors = errorLog()
  const consumer = createConsumer({
    secret,
    client,
    idempotency: true,
    onError: errors.onError,
    handler: () => {
      runs++
    },
  })
  await register(
    'idem',
    await serve(t, (req, res) => {
      pushes++
      consumer.listener(req, res)
    }),
    secret,
  )

  await produce('idem', [{ value: 'once' }])
  await lagZero('idem')
  t.equal(runs, 1, 'handled once')
  t.equal(pushes, 2, 'pushed twice: the first ack was dropped')
  t.same(
    errors.seen.map((e) => e.stage),
    ['ack'],
  )
  const log = await waitUntil(
    async () => {
      const d = await deliveries('idem')
      return d.length === 2 && d[1]!.outcome === 'acked' && d.every((x) => x.statusCode !== null) ? d : undefined
    },
    10_000,
    'both attempts logged',
  )
  t.match(
    log,
    [
      { attempt: 1, outcome: 'failed', statusCode: 500 },
      { attempt: 2, outcome: 'acked', statusCode: 200 },
    ],
    'the failed ack failed the attempt at once (500) rather than waiting for the ack deadline',
  )

  await unwrap(hookq.POST('/v1/groups/{group}/seek', { params: { path: { group: 'idem' } }, body: { partition: 0, offset: 0 } }))
  await waitUntil(() => pushes === 3, 10_000, 'the push after the seek')
  await lagZero('idem')
  t.equal(runs, 1, 'the replayed webhook-id was acked without running the handler')
})

t.test('idempotency: a push timeout mid-handler does not run the handler twice at once', async (t) => {
  await setup('slow', { pushTimeoutMs: 300, maxDeliveries: 20, retry: { initialDelayMs: 200, multiplier: 1, jitter: 0 } })
  const secret = generateSecret()
  let runs = 0
  let pushes = 0
  const consumer = createConsumer({
    secret,
    baseUrl: url,
    idempotency: true,
    onError: () => {},
    handler: async () => {
      runs++
      await new Promise((resolve) => setTimeout(resolve, 1500)) // the work: five push timeouts long
    },
  })
  await register(
    'slow',
    await serve(t, (req, res) => {
      pushes++
      consumer.listener(req, res)
    }),
    secret,
  )
  await produce('slow', [{ value: 'slow' }])
  await lagZero('slow')
  t.ok(pushes >= 2, `the broker pushed again while the handler ran (${pushes} pushes)`)
  t.equal(runs, 1, 'the later pushes waited for the first and found it handled')
})

t.test('raw format: the bare value with hookq-* headers becomes the same message', async (t) => {
  await setup('rawfmt', { pushFormat: 'raw' })
  const secret = generateSecret()
  const seen: PushMessage[] = []
  const consumer = createConsumer({
    secret,
    baseUrl: url,
    group: 'rawfmt',
    handler: (m) => {
      seen.push(m)
    },
  })
  await register('rawfmt', await serve(t, consumer.listener), secret)
  await produce('rawfmt', [
    { key: 'clé-ü ☃', value: { text: 'naïve \u0000 ok', list: [1, 2] }, headers: { origin: 'tést' } },
    { value: 'just a string' },
  ])
  await lagZero('rawfmt')
  t.equal(seen.length, 2)
  // Pushed in parallel: they may have arrived in either order.
  seen.sort((a, b) => a.offset - b.offset)
  t.match(seen[0], {
    format: 'raw',
    topic: 'rawfmt',
    group: 'rawfmt',
    partition: 0,
    offset: 0,
    attempt: 1,
    key: 'clé-ü ☃',
    value: { text: 'naïve \u0000 ok', list: [1, 2] },
    headers: { origin: 'tést' },
  })
  t.match(seen[0]!.deliveryId, /^[A-Za-z0-9_-]{48}$/)
  t.match(seen[0]!.webhookId, /^msg_\d+_0_0$/)
  t.ok(seen[0]!.ackDeadline.getTime() > seen[0]!.timestamp.getTime())
  t.match(seen[1], { format: 'raw', offset: 1, key: null, value: 'just a string', headers: {} })
})

t.test('auto ack mode: the answer is the ack; a failure answers 503 with Retry-After and no API call', async (t) => {
  await setup('auto', { ackMode: 'auto', retry: { initialDelayMs: 100 } })
  const secret = generateSecret()
  const attempts: number[] = []
  // Nothing listens on the discard port: an API call from the consumer would fail and show in onError.
  const errors = errorLog()
  const consumer = createConsumer({
    secret,
    ackMode: 'auto',
    baseUrl: 'http://127.0.0.1:9',
    nackDelayMs: 1000,
    onError: errors.onError,
    handler: (m) => {
      attempts.push(m.attempt)
      if (m.attempt === 1) throw new Error('not yet')
    },
  })
  await register('auto', await serve(t, consumer.listener), secret)
  await produce('auto', [{ value: 'a' }])
  await lagZero('auto')
  t.same(attempts, [1, 2])
  t.same(
    errors.seen.map((e) => e.stage),
    ['handler'],
    'no ack or nack call was tried',
  )
  const log = await waitUntil(
    async () => {
      const d = await deliveries('auto')
      return d.length === 2 && d[1]!.outcome === 'acked' && d.every((x) => x.statusCode !== null) ? d : undefined
    },
    10_000,
    'both attempts logged',
  )
  t.match(log, [
    { attempt: 1, outcome: 'failed', statusCode: 503 },
    { attempt: 2, outcome: 'acked', statusCode: 200 },
  ])
  const gapMs = Date.parse(log[1]!.startedAt) - Date.parse(log[0]!.startedAt)
  t.ok(gapMs >= 900, `Retry-After stretched the 100 ms backoff to 1 s (${gapMs} ms)`)
})

t.test('Fastify: the plugin keeps the raw body for the signature; other routes still parse JSON', async (t) => {
  await setup('fastify')
  const secret = generateSecret()
  const values: unknown[] = []
  const extended: string[] = []
  const consumer = createConsumer({
    secret,
    baseUrl: url,
    group: 'fastify',
    handler: async (m, ctx) => {
      extended.push(await ctx.extend(60_000))
      values.push(m.value)
    },
  })
  const app = Fastify()
  await app.register(consumer.fastify, { path: '/hookq' })
  app.post('/other', async (request) => ({ parsed: request.body }))
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => app.close())
  await register('fastify', `${base}/hookq`, secret)

  await produce('fastify', [{ value: { via: 'fastify', n: 1.5 } }])
  await lagZero('fastify')
  t.same(values, [{ via: 'fastify', n: 1.5 }])
  t.same(extended, ['extended'], 'ctx.extend moved the ack deadline')

  const nowS = Math.floor(Date.now() / 1000)
  const body = envelope('fastify')
  const bad = await post(`${base}/hookq`, body, { 'webhook-id': 'i', 'webhook-timestamp': String(nowS), 'webhook-signature': 'v1,AAAA' })
  t.match(bad, { status: 401, json: { reason: 'bad_signature' } })
  const other = await post(`${base}/other`, '{"a":1}', {})
  t.same(other.json, { parsed: { a: 1 } }, "the app's own JSON parser is untouched")
  t.same(values.length, 1, 'the refused push ran nothing')
})

t.test('explicit mode against a broker with keys, without a key (or with a produce key): the refusal says what to do', async (t) => {
  const keyed = await startListeningBroker(t, { HOOKQ_API_KEYS: 'ak_root:admin,pk_only:produce' })
  const secret = generateSecret()
  const nowS = Math.floor(Date.now() / 1000)
  const id = 'msg_hand_0_0'
  const body = envelope('keyed')
  const headers = {
    'webhook-id': id,
    'webhook-timestamp': String(nowS),
    'webhook-signature': signWebhook({ id, timestampS: nowS, body, secrets: [secret] }),
    'hookq-signature': signHeaders({ id, timestampS: nowS, headers: {}, secrets: [secret] }),
  }
  for (const [apiKey, why] of [
    [undefined, /no API key is set \(401\)/],
    ['pk_only', /its API key lacks the consume scope \(403\)/],
    ['wrong', /its API key is not valid \(401\)/],
  ] as const) {
    const errors = errorLog()
    let runs = 0
    // HOOKQ_API_KEY may be set where the tests run: '' means "none" to the client, as unset does.
    const consumer = createConsumer({
      secret,
      baseUrl: keyed.url,
      apiKey: apiKey ?? '',
      onError: errors.onError,
      handler: () => {
        runs++
      },
    })
    const answer = await post(await serve(t, consumer.listener), body, headers)
    t.equal(runs, 1, `${apiKey ?? 'no key'}: the handler ran`)
    t.match(answer, { status: 500, json: { error: 'ack_unauthorized' } }, 'the answer names the cause')
    t.same(
      errors.seen.map((e) => e.stage),
      ['ack'],
    )
    t.match((errors.seen[0]!.error as Error).message, why)
    t.match((errors.seen[0]!.error as Error).message, /Set HOOKQ_API_KEY \(or the apiKey option\) to a key with the consume scope/)
  }
})

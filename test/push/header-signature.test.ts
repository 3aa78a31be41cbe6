/**
 * hookq-signature: the broker signs its hookq-* push headers, so a captured raw push cannot be
 * replayed with other coordinates (topic, partition, offset, key, headers, delivery id, attempt).
 * Real pushes from a real broker to a real receiver, verified by the consumer helper's verifier;
 * then each signed header altered, removed or added in turn. Also: the broker and the helper
 * sign the same list of headers.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import {
  SIGNED_HEADERS as HELPER_SIGNED,
  createConsumer,
  signedHeaderContent,
  signHeaders,
  verifyWebhook,
  WebhookVerificationError,
} from '@hookq/client/consumer'
import { SIGNED_HEADERS as BROKER_SIGNED } from '../../src/core/signature.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'

const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`
const broker = await startBroker(t)
const { call, produce } = api(broker)

t.same([...HELPER_SIGNED], [...BROKER_SIGNED], 'the consumer helper checks the headers the broker signs')

/** The headers of a received push as a plain record of strings. */
const headersOf = (r: Received) => Object.fromEntries(Object.entries(r.headers).map(([k, v]) => [k, String(v)]))
const reason = (headers: Record<string, string>, body: string, requireHeaderSignature = false) => {
  try {
    verifyWebhook({ headers, body, secret, requireHeaderSignature })
    return 'ok'
  } catch (err) {
    return err instanceof WebhookVerificationError ? err.reason : `threw ${String(err)}`
  }
}

async function firstPush(t: Test, name: string, pushFormat: 'raw' | 'envelope') {
  const receiver = await startReceiver(t, { status: 200 })
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 1 })).status, 201)
  t.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name, pushFormat, ackMode: 'auto' })).status, 201)
  t.equal((await call('POST', `/v1/groups/${name}-g/consumers`, { url: receiver.url, secret })).status, 201)
  t.equal((await produce(name, [{ key: 'k-1', value: { n: 1 }, headers: { trace: 'é' } }])).status, 201)
  const [push] = await receiver.waitFor(1, 10_000)
  return push!
}
t.test('raw pushes: every hookq-* header is covered', async (t) => {
  const push = await firstPush(t, 'rawsig', 'raw')
  const headers = headersOf(push)
  t.ok(headers['hookq-signature']?.startsWith('v1,'), 'hookq-signature sent')
  t.ok(headers['hookq-key'] && headers['hookq-headers'], 'key and headers travel as headers')
  t.equal(reason(headers, push.body), 'ok', 'the push as sent verifies')

  for (const name of BROKER_SIGNED) {
    const changed = { ...headers, [name]: headers[name] === undefined ? '"x"' : `${headers[name]}1` }
    t.equal(reason(changed, push.body), 'bad_header_signature', `${name} changed`)
    if (headers[name] !== undefined) {
      const { [name]: _, ...removed } = headers
      t.equal(reason(removed, push.body), 'bad_header_signature', `${name} removed`)
    }
  }
  const { 'hookq-signature': _, ...unsigned } = headers
  t.equal(reason(unsigned, push.body), 'missing_headers', 'hookq-signature removed')
  t.equal(
    reason({ ...headers, 'hookq-signature': headers['webhook-signature']! }, push.body),
    'bad_header_signature',
    'the body signature in its place',
  )
  t.equal(reason(headers, `${push.body} `), 'bad_signature', 'the body still checked first')
  t.equal(reason({ ...headers, 'hookq-key': '' }, push.body), 'bad_header_signature', 'an empty header is not an absent one')

  // Replayed with every hookq-* header stripped, the push is a plain Standard Webhooks one: a
  // verifier told that every push comes from hookq (as the consumer helper is) refuses it.
  const stripped = Object.fromEntries(Object.entries(headers).filter(([k]) => !k.startsWith('hookq-')))
  t.equal(reason(stripped, push.body), 'ok', 'a plain Standard Webhooks verifier cannot tell')
  t.equal(reason(stripped, push.body, true), 'missing_headers', 'requireHeaderSignature refuses it')

  // Its own key: the header signature is not a webhook-signature over the header text as a body.
  const headerText = signedHeaderContent(headers)
  t.equal(
    reason(
      {
        'webhook-id': headers['webhook-id']!,
        'webhook-timestamp': headers['webhook-timestamp']!,
        'webhook-signature': headers['hookq-signature']!,
      },
      headerText,
    ),
    'bad_signature',
    'hookq-signature does not sign the header text as a body',
  )
  // The helper's signer agrees with the broker's.
  t.equal(
    signHeaders({ webhookId: headers['webhook-id']!, timestampSeconds: Number(headers['webhook-timestamp']), headers, secrets: secret }),
    headers['hookq-signature'],
    "signHeaders gives the broker's signature",
  )

  // The consumer helper refuses the altered push with 401 and never runs the handler.
  const handled: unknown[] = []
  const consumer = createConsumer({
    secret,
    ackMode: 'auto',
    handler: (m) => {
      handled.push(m)
    },
  })
  const altered = await consumer.handle({ headers: { ...headers, 'hookq-offset': '7' }, body: push.body })
  t.match(altered, { status: 401 }, 'altered offset: 401')
  t.equal(handled.length, 0, 'handler not run')
  t.match(await consumer.handle({ headers: stripped, body: push.body }), { status: 401 }, 'stripped of its hookq-* headers: 401')
  t.equal(handled.length, 0, 'handler not run')
  const genuine = await consumer.handle({ headers, body: push.body })
  t.match(genuine, { status: 200 })
  t.match(handled, [{ offset: 0, key: 'k-1', value: { n: 1 }, headers: { trace: 'é' }, format: 'raw' }])
})

t.test('envelope pushes sign their hookq-* headers too', async (t) => {
  const push = await firstPush(t, 'envsig', 'envelope')
  const headers = headersOf(push)
  t.equal(reason(headers, push.body), 'ok')
  t.equal(reason({ ...headers, 'hookq-attempt': '9' }, push.body), 'bad_header_signature', 'attempt changed')
  t.equal(reason({ ...headers, 'hookq-topic': 'other' }, push.body), 'bad_header_signature', 'made to look like a raw push')
})

t.test('no secret, no signatures', async (t) => {
  const receiver = await startReceiver(t, { status: 200 })
  t.equal((await call('PUT', '/v1/topics/nosig', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/nosig-g', { topic: 'nosig', pushFormat: 'raw', ackMode: 'auto' })).status, 201)
  t.equal((await call('POST', '/v1/groups/nosig-g/consumers', { url: receiver.url })).status, 201)
  t.equal((await produce('nosig', [{ value: 1 }])).status, 201)
  const [push] = await receiver.waitFor(1, 10_000)
  t.equal(push!.headers['hookq-signature'], undefined)
  t.equal(push!.headers['webhook-signature'], undefined)
})

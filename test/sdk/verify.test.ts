/**
 * Standard Webhooks verification in the client package (@hookq/client/consumer), checked against
 * the broker's own signer (src/core/signature.ts): the two are separate implementations and
 * must agree byte for byte. Tolerance edges, rotation, header shapes and typed failures.
 */
import t from '../helpers/tap.ts'
import { verifyWebhook, signWebhook, WebhookVerificationError } from '@hookq/client/consumer'
import { generateSecret, signWebhook as brokerSign } from '../../src/core/signature.ts'

const secret = generateSecret()
const other = generateSecret(24)
const id = 'msg_7_0_41'
const nowMs = 1_800_000_000_000
const nowS = nowMs / 1000
const body = '{"deliveryId":"d","value":{"text":"naïve ☃"}}'

function headersFor(secrets: string[], timestampS = nowS, b: string | Buffer = body): Record<string, string> {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(timestampS),
    'webhook-signature': brokerSign({ id, timestampS, body: b, secrets }),
  }
}

/** The reason verifyWebhook throws with, or 'ok'. */
function outcome(options: Parameters<typeof verifyWebhook>[0]): string {
  try {
    verifyWebhook(options)
    return 'ok'
  } catch (err) {
    if (err instanceof WebhookVerificationError) return err.reason
    throw err
  }
}

t.test('a push the broker signed verifies, as a string or as the raw bytes', async (t) => {
  t.same(verifyWebhook({ secret, headers: headersFor([secret]), body, nowMs }), { webhookId: id, timestampSeconds: nowS })
  t.equal(outcome({ secret, headers: headersFor([secret]), body: Buffer.from(body), nowMs }), 'ok')
  t.equal(outcome({ secret: secret.slice('whsec_'.length), headers: headersFor([secret]), body, nowMs }), 'ok', 'the prefix is optional')
  t.equal(
    signWebhook({ webhookId: id, timestampSeconds: nowS, body, secrets: [secret, other] }),
    headersFor([secret, other])['webhook-signature'],
    'the client signs exactly like the broker',
  )
})

t.test('rotation: two signatures, either secret verifies; several secrets of our own too', async (t) => {
  const both = headersFor([other, secret])
  t.equal(outcome({ secret, headers: both, body, nowMs }), 'ok', 'the old secret')
  t.equal(outcome({ secret: other, headers: both, body, nowMs }), 'ok', 'the new secret')
  t.equal(outcome({ secrets: [generateSecret(), secret], headers: headersFor([secret]), body, nowMs }), 'ok', 'any of our secrets')
  t.equal(outcome({ secrets: [generateSecret(), generateSecret()], headers: both, body, nowMs }), 'bad_signature')
})

t.test('the timestamp must be within the tolerance, either way', async (t) => {
  for (const [offsetS, want] of [
    [-300, 'ok'],
    [300, 'ok'],
    [-301, 'timestamp_out_of_tolerance'],
    [301, 'timestamp_out_of_tolerance'],
  ] as const) {
    t.equal(outcome({ secret, headers: headersFor([secret], nowS + offsetS), body, nowMs }), want, `${offsetS} s`)
  }
  t.equal(outcome({ secret, headers: headersFor([secret], nowS - 20), body, nowMs, toleranceSeconds: 10 }), 'timestamp_out_of_tolerance')
  const stale = headersFor([secret], Math.floor(Date.now() / 1000) - 3600)
  t.equal(outcome({ secret, headers: stale, body }), 'timestamp_out_of_tolerance', 'against the real clock by default')
})

t.test('anything else fails with a typed reason', async (t) => {
  const good = headersFor([secret])
  for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
    const { [name]: _, ...rest } = good
    t.equal(outcome({ secret, headers: rest, body, nowMs }), 'missing_headers', `without ${name}`)
  }
  for (const ts of ['abc', '1.5', '-1', '']) {
    t.equal(
      outcome({ secret, headers: { ...good, 'webhook-timestamp': ts }, body, nowMs }),
      ts === '' ? 'missing_headers' : 'invalid_timestamp',
      `timestamp ${JSON.stringify(ts)}`,
    )
  }
  t.equal(outcome({ secret, headers: good, body: body.replace('naïve', 'naive'), nowMs }), 'bad_signature', 'a changed body')
  t.equal(outcome({ secret, headers: { ...good, 'webhook-id': 'msg_7_0_42' }, body, nowMs }), 'bad_signature', 'another id')
  const sig = good['webhook-signature']!.slice(3)
  t.equal(
    outcome({ secret, headers: { ...good, 'webhook-signature': `v2,${sig} v1a,${sig}` }, body, nowMs }),
    'bad_signature',
    'only v1 entries count',
  )
  t.equal(
    outcome({ secret, headers: { ...good, 'webhook-signature': `v1,${sig.slice(0, 20)}` }, body, nowMs }),
    'bad_signature',
    'a cut signature',
  )
  t.equal(
    outcome({ secret, headers: { ...good, 'webhook-signature': `v1,bogus v1,${sig}` }, body, nowMs }),
    'ok',
    'one match among several entries',
  )
  const err = (() => {
    try {
      verifyWebhook({ secret: other, headers: good, body, nowMs })
    } catch (e) {
      return e
    }
  })()
  t.ok(err instanceof WebhookVerificationError && err instanceof Error)
  t.match(err, { name: 'WebhookVerificationError', reason: 'bad_signature', message: /no v1 signature/ })
})

t.test('header shapes: fetch Headers, node arrays, any case', async (t) => {
  const good = headersFor([secret])
  t.equal(outcome({ secret, headers: new Headers(good), body, nowMs }), 'ok', 'Headers')
  const [first, second] = brokerSign({ id, timestampS: nowS, body, secrets: [other, secret] }).split(' ')
  t.equal(outcome({ secret, headers: { ...good, 'webhook-signature': [first!, second!] }, body, nowMs }), 'ok', 'a repeated header')
  t.equal(
    outcome({
      secret,
      headers: { 'Webhook-Id': id, 'WEBHOOK-TIMESTAMP': String(nowS), 'webhook-Signature': good['webhook-signature'] },
      body,
      nowMs,
    }),
    'ok',
    'mixed case',
  )
})

t.test('a missing or malformed secret is a configuration error (TypeError), not a failed push', async (t) => {
  const headers = headersFor([secret])
  t.throws(() => verifyWebhook({ headers, body, nowMs }), TypeError)
  t.throws(() => verifyWebhook({ secret: 'whsec_not base64!', headers, body, nowMs }), TypeError)
  t.throws(() => verifyWebhook({ secret: 'whsec_', headers, body, nowMs }), TypeError)
  t.throws(() => signWebhook({ webhookId: id, timestampSeconds: nowS, body, secrets: [] }), TypeError)
  // A tolerance that is not a number would let the timestamp check pass for a push signed years ago.
  for (const toleranceSeconds of [NaN, -1, Infinity]) {
    t.throws(() => verifyWebhook({ secret, headers, body, nowMs, toleranceSeconds }), TypeError, `toleranceSeconds ${toleranceSeconds}`)
  }
})

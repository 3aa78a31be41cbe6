import t from '../helpers/tap.ts'
import { createHmac } from 'node:crypto'
import { verifyWebhook as verifyPush, WebhookVerificationError } from '@hookq/client/consumer'
import { decodeSecret, generateSecret, signWebhook } from '../../src/core/signature.ts'

/**
 * What a consumer sees of the broker's signatures: the SDK's verifier (the one consumers use; the
 * broker only signs), as an outcome to compare.
 */
function verifyWebhook(
  headers: Headers | Record<string, string>,
  body: string | Buffer,
  secret: string | string[],
  { nowS, toleranceS }: { nowS?: number; toleranceS?: number } = {},
) {
  try {
    const v = verifyPush({
      headers,
      body,
      secrets: typeof secret === 'string' ? [secret] : secret,
      ...(nowS === undefined ? {} : { nowMs: nowS * 1000 }),
      ...(toleranceS === undefined ? {} : { toleranceSeconds: toleranceS }),
    })
    return { ok: true as const, id: v.webhookId, timestampS: v.timestampSeconds }
  } catch (err) {
    if (!(err instanceof WebhookVerificationError)) throw err
    return { ok: false as const, reason: err.reason }
  }
}

// The Standard Webhooks / svix published test vector.
const VECTOR = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  id: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestampS: 1614265330,
  body: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
}

/** The scheme written out independently: HMAC-SHA256 over `id.ts.body` keyed by the decoded base64. */
function referenceSign(secret: string, id: string, timestampS: number, body: string): string {
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64')
  return (
    'v1,' +
    createHmac('sha256', key)
      .update(Buffer.from(`${id}.${timestampS}.${body}`, 'utf8'))
      .digest('base64')
  )
}

const headersFor = (id: string, timestampS: number, signature: string) => ({
  'webhook-id': id,
  'webhook-timestamp': String(timestampS),
  'webhook-signature': signature,
})

t.test('the published vector and an independent implementation agree with signWebhook', async (t) => {
  t.equal(referenceSign(VECTOR.secret, VECTOR.id, VECTOR.timestampS, VECTOR.body), VECTOR.signature, 'reference is right')
  t.equal(signWebhook({ ...VECTOR, secrets: [VECTOR.secret] }), VECTOR.signature)
  const secret = generateSecret()
  const body = JSON.stringify({ value: 'ünïcødé \u0000 ✓', n: 1 })
  t.equal(signWebhook({ id: 'd-1', timestampS: 1_700_000_000, body, secrets: [secret] }), referenceSign(secret, 'd-1', 1_700_000_000, body))
  t.equal(
    signWebhook({ id: 'd-1', timestampS: 1_700_000_000, body: Buffer.from(body), secrets: [secret] }),
    referenceSign(secret, 'd-1', 1_700_000_000, body),
    'a Buffer body signs as its bytes',
  )
})

t.test('a secret without the prefix is the same base64 key', async (t) => {
  t.equal(signWebhook({ ...VECTOR, secrets: [VECTOR.secret.slice('whsec_'.length)] }), VECTOR.signature)
})

t.test('rotation: two secrets give two entries, each verifies alone', async (t) => {
  const [oldSecret, newSecret] = [generateSecret(), generateSecret()]
  const header = signWebhook({ id: 'msg', timestampS: 1000, body: 'b', secrets: [newSecret, oldSecret] })
  const entries = header.split(' ')
  t.equal(entries.length, 2)
  t.equal(entries[0], referenceSign(newSecret, 'msg', 1000, 'b'))
  t.equal(entries[1], referenceSign(oldSecret, 'msg', 1000, 'b'))
  for (const secret of [oldSecret, newSecret]) {
    t.match(verifyWebhook(headersFor('msg', 1000, header), 'b', secret, { nowS: 1000 }), { ok: true, id: 'msg', timestampS: 1000 })
  }
  t.match(
    verifyWebhook(headersFor('msg', 1000, header), 'b', [generateSecret(), oldSecret], { nowS: 1000 }),
    { ok: true },
    'a consumer holding several secrets',
  )
})

t.test('verifyWebhook accepts the vector and rejects tampering, wrong secrets and stale timestamps', async (t) => {
  const h = headersFor(VECTOR.id, VECTOR.timestampS, VECTOR.signature)
  const at = { nowS: VECTOR.timestampS }
  t.match(verifyWebhook(h, VECTOR.body, VECTOR.secret, at), { ok: true })
  t.match(verifyWebhook(new Headers(h), Buffer.from(VECTOR.body), VECTOR.secret, at), { ok: true }, 'fetch Headers, Buffer body')
  t.same(verifyWebhook(h, VECTOR.body.replace('2432', '2433'), VECTOR.secret, at), { ok: false, reason: 'bad_signature' }, 'tampered body')
  t.same(
    verifyWebhook({ ...h, 'webhook-id': 'msg_other' }, VECTOR.body, VECTOR.secret, at),
    { ok: false, reason: 'bad_signature' },
    'other id',
  )
  t.same(verifyWebhook(h, VECTOR.body, generateSecret(), at), { ok: false, reason: 'bad_signature' }, 'wrong secret')
  t.same(
    verifyWebhook({ ...h, 'webhook-signature': `v1a,${VECTOR.signature.slice(3)}` }, VECTOR.body, VECTOR.secret, at),
    { ok: false, reason: 'bad_signature' },
    'other versions are ignored',
  )
  t.match(
    verifyWebhook({ ...h, 'webhook-signature': `v1,bogus ${VECTOR.signature}` }, VECTOR.body, VECTOR.secret, at),
    { ok: true },
    'any matching entry is enough',
  )

  t.match(verifyWebhook(h, VECTOR.body, VECTOR.secret, { nowS: VECTOR.timestampS + 300 }), { ok: true }, 'at the edge of the default 5 min')
  t.same(
    verifyWebhook(h, VECTOR.body, VECTOR.secret, { nowS: VECTOR.timestampS + 301 }),
    { ok: false, reason: 'timestamp_out_of_tolerance' },
    'too old',
  )
  t.same(
    verifyWebhook(h, VECTOR.body, VECTOR.secret, { nowS: VECTOR.timestampS - 301 }),
    { ok: false, reason: 'timestamp_out_of_tolerance' },
    'too far ahead',
  )
  t.same(verifyWebhook(h, VECTOR.body, VECTOR.secret, { nowS: VECTOR.timestampS + 10, toleranceS: 5 }), {
    ok: false,
    reason: 'timestamp_out_of_tolerance',
  })
  t.same(verifyWebhook(h, VECTOR.body, VECTOR.secret), { ok: false, reason: 'timestamp_out_of_tolerance' }, 'nowS defaults to the clock')

  t.same(verifyWebhook({ ...h, 'webhook-timestamp': '16142653.30' }, VECTOR.body, VECTOR.secret, at), {
    ok: false,
    reason: 'invalid_timestamp',
  })
  t.same(verifyWebhook({ 'webhook-id': VECTOR.id }, VECTOR.body, VECTOR.secret, at), { ok: false, reason: 'missing_headers' })
})

t.test('secrets: generated ones round-trip, malformed or short ones are refused', async (t) => {
  const secret = generateSecret()
  t.match(secret, /^whsec_[A-Za-z0-9+/]+=*$/)
  t.equal(decodeSecret(secret).length, 32)
  t.equal(decodeSecret(generateSecret(24)).length, 24)
  t.not(generateSecret(), secret)
  t.throws(() => generateSecret(8), RangeError)
  t.throws(() => decodeSecret('whsec_c2hvcnQ='), RangeError, 'too short ("short")')
  t.throws(() => decodeSecret('whsec_not base64!'), RangeError)
  t.throws(() => decodeSecret(''), RangeError)
  t.throws(() => signWebhook({ id: 'x', timestampS: 1, body: '', secrets: [] }), RangeError)
  t.throws(() => signWebhook({ id: 'x', timestampS: 1.5, body: '', secrets: [secret] }), RangeError)
})

/**
 * Consumer secret rotation (POST /v1/groups/{group}/consumers/{id}/secret) against the real broker:
 * the answer, a generated secret shown once, pushes signed with both secrets during the overlap
 * (checked with an HMAC written here, not src's), one signature after it, and 4xx answers that
 * write nothing.
 */
import t from '../helpers/tap.ts'
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, allCompleted } = api(broker)

const newSecret = (bytes = 32) => `whsec_${randomBytes(bytes).toString('base64')}`
const header = (r: Received, name: string) => {
  const v = r.headers[name]
  return Array.isArray(v) ? v.join(' ') : v
}
/** The `v1,` entries of webhook-signature, in order. */
const signatures = (r: Received) => (header(r, 'webhook-signature') ?? '').split(' ').filter((e) => e.length > 0)

/** Whether one `v1,<base64>` entry is the Standard Webhooks HMAC of this push under `secret`. */
function entryVerifies(secret: string, r: Received, entry: string): boolean {
  const id = header(r, 'webhook-id')
  const ts = header(r, 'webhook-timestamp')
  if (!id || !ts || !entry.startsWith('v1,')) return false
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64')
  const expected = createHmac('sha256', key)
    .update(Buffer.from(`${id}.${ts}.${r.body}`, 'utf8'))
    .digest()
  const got = Buffer.from(entry.slice(3), 'base64')
  return got.length === expected.length && timingSafeEqual(got, expected)
}

interface TT {
  equal(found: unknown, wanted: unknown): boolean
  teardown(fn: () => unknown): void
}

/** A one-partition topic, an auto-ack group on it and one consumer (with `secret`, if given) at a fresh receiver. */
async function setup(tt: TT, name: string, secret?: string) {
  tt.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 1 })).status, 201)
  tt.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name, ackMode: 'auto' })).status, 201)
  const receiver = await startReceiver(tt)
  const res = await call('POST', `/v1/groups/${name}-g/consumers`, { url: receiver.url, ...(secret ? { secret } : {}) })
  tt.equal(res.status, 201)
  let sent = 0
  /** Produces one message and returns its push. */
  const pushOne = async () => {
    await produce(name, [{ value: { n: sent } }])
    sent++
    const requests = await receiver.waitFor(sent, 5000)
    await allCompleted(`${name}-g`)
    return requests[sent - 1]!
  }
  return { group: `${name}-g`, id: res.json.id as string, receiver, pushOne }
}

const rotate = (group: string, id: string, body: unknown) => call('POST', `/v1/groups/${group}/consumers/${id}/secret`, body)

t.test('rotation to a given secret: both sign during the overlap, the new one first', async (t) => {
  const [oldS, newS] = [newSecret(), newSecret(24)]
  const { group, id, pushOne } = await setup(t, 'given', oldS)
  const before = await pushOne()
  t.equal(signatures(before).length, 1, 'one signature before the rotation')
  t.ok(entryVerifies(oldS, before, signatures(before)[0]!))

  const startedAt = Date.now()
  const res = await rotate(group, id, { secret: newS })
  t.equal(res.status, 200)
  t.same(
    Object.keys(res.json).sort(),
    ['createdAt', 'hasSecret', 'id', 'previousSecretExpiresAt', 'secretRotatedAt', 'url'],
    'no secret in the answer when the caller gave it',
  )
  t.match(res.json, { id, hasSecret: true })
  const rotatedAt = Date.parse(res.json.secretRotatedAt)
  t.ok(rotatedAt >= startedAt - 1000 && rotatedAt <= Date.now() + 1000, 'secretRotatedAt is now')
  t.equal(Date.parse(res.json.previousSecretExpiresAt) - rotatedAt, 86_400_000, 'the overlap defaults to 24 h')
  t.notOk(JSON.stringify(res.json).includes('whsec_'))

  const after = await pushOne()
  const sigs = signatures(after)
  t.equal(sigs.length, 2, 'two v1 signatures during the overlap')
  t.match(header(after, 'webhook-signature'), /^v1,[A-Za-z0-9+/]+=* v1,[A-Za-z0-9+/]+=*$/)
  t.ok(entryVerifies(newS, after, sigs[0]!), 'the first verifies with the new secret')
  t.notOk(entryVerifies(oldS, after, sigs[0]!))
  t.ok(entryVerifies(oldS, after, sigs[1]!), 'the second verifies with the old secret')
  t.notOk(entryVerifies(newS, after, sigs[1]!))
  t.notOk(entryVerifies(newSecret(), after, sigs[0]!), 'a third secret verifies neither')

  // Retrying the same rotation (a lost answer) keeps the old secret as the previous one.
  const again = await rotate(group, id, { secret: newS })
  t.equal(again.status, 200)
  t.equal(again.json.previousSecretExpiresAt, res.json.previousSecretExpiresAt, 'a retried rotation keeps the overlap')
  const retried = await pushOne()
  t.equal(signatures(retried).length, 2)
  t.ok(entryVerifies(newS, retried, signatures(retried)[0]!) && entryVerifies(oldS, retried, signatures(retried)[1]!), 'still new then old')

  // A second real rotation drops the oldest secret: the current and the one it replaced sign.
  const third = newSecret()
  t.equal((await rotate(group, id, { secret: third, overlapMs: 60_000 })).status, 200)
  const later = await pushOne()
  t.equal(signatures(later).length, 2)
  t.ok(entryVerifies(third, later, signatures(later)[0]!), 'newest first')
  t.ok(entryVerifies(newS, later, signatures(later)[1]!), 'then the one it replaced')
  t.notOk(
    signatures(later).some((s) => entryVerifies(oldS, later, s)),
    'the oldest no longer signs',
  )
})

t.test('a generated secret: returned once, never listed; after the overlap only it signs', async (t) => {
  const oldS = newSecret()
  const { group, id, pushOne } = await setup(t, 'generated', oldS)
  // Long enough that a slow machine still pushes inside it; the wait for its end grows with it.
  const overlapMs = 5000
  const res = await rotate(group, id, { overlapMs })
  t.equal(res.status, 200)
  const generated = res.json.secret as string
  t.match(generated, /^whsec_[A-Za-z0-9+/]+=*$/, 'the generated secret is in the answer')
  t.equal(Buffer.from(generated.slice('whsec_'.length), 'base64').length, 32, '256 bits')
  t.not(generated, oldS)
  t.equal(Date.parse(res.json.previousSecretExpiresAt) - Date.parse(res.json.secretRotatedAt), overlapMs)

  const listed = await call('GET', `/v1/groups/${group}/consumers`)
  t.equal(listed.status, 200)
  t.match(listed.json.consumers, [{ id, hasSecret: true }])
  t.notOk(JSON.stringify(listed.json).includes('whsec_'), 'GET consumers never shows a secret')
  t.notOk(JSON.stringify((await call('GET', `/v1/groups/${group}`)).json).includes('whsec_'), 'nor does the group status')

  const during = await pushOne()
  t.ok(Date.now() < Date.parse(res.json.previousSecretExpiresAt), 'pushed inside the overlap')
  t.equal(signatures(during).length, 2)
  t.ok(entryVerifies(generated, during, signatures(during)[0]!), 'generated secret first')
  t.ok(entryVerifies(oldS, during, signatures(during)[1]!), 'old secret second')

  await waitUntil(() => Date.now() > Date.parse(res.json.previousSecretExpiresAt) + 50, 10_000, 'the overlap to end')
  const after = await pushOne()
  t.equal(signatures(after).length, 1, 'one signature after the overlap')
  t.ok(entryVerifies(generated, after, signatures(after)[0]!))
  t.notOk(entryVerifies(oldS, after, signatures(after)[0]!))
})

t.test('a consumer without a secret gets one, with no previous secret', async (t) => {
  const { group, id, pushOne } = await setup(t, 'unsigned')
  const before = await pushOne()
  t.equal(header(before, 'webhook-signature'), undefined, 'unsigned before')
  const res = await rotate(group, id, {})
  t.equal(res.status, 200)
  t.match(res.json, { id, hasSecret: true, previousSecretExpiresAt: null })
  const secret = res.json.secret as string
  t.match(secret, /^whsec_/)
  const after = await pushOne()
  t.equal(signatures(after).length, 1)
  t.ok(entryVerifies(secret, after, signatures(after)[0]!))
  t.match((await call('GET', `/v1/groups/${group}/consumers`)).json.consumers, [{ id, hasSecret: true }])
})

t.test('4xx answers: problem details, nothing written', async (t) => {
  const secret = newSecret()
  const { group, id } = await setup(t, 'bad', secret)
  const row = async () =>
    (await sql('SELECT secret, previous_secret, previous_secret_expires_at, secret_rotated_at FROM consumers WHERE id = $1', [id]))[0]
  const before = await row()
  t.match(before, { secret, previous_secret: null, previous_secret_expires_at: null, secret_rotated_at: null })

  const cases: [string, string, unknown, number, string][] = [
    ['no such group', `/v1/groups/nope/consumers/${id}/secret`, {}, 404, 'group_not_found'],
    ['no such consumer', `/v1/groups/${group}/consumers/nope/secret`, {}, 404, 'consumer_not_found'],
    ["another group's consumer id", `/v1/groups/given-g/consumers/${id}/secret`, {}, 404, 'consumer_not_found'],
    [
      'secret without whsec_',
      `/v1/groups/${group}/consumers/${id}/secret`,
      { secret: 'plain-secret-plain-secret' },
      400,
      'invalid_request',
    ],
    ['secret under 24 bytes', `/v1/groups/${group}/consumers/${id}/secret`, { secret: newSecret(12) }, 400, 'invalid_request'],
    ['secret over 64 bytes', `/v1/groups/${group}/consumers/${id}/secret`, { secret: newSecret(65) }, 400, 'invalid_request'],
    [
      'secret that is not base64',
      `/v1/groups/${group}/consumers/${id}/secret`,
      { secret: 'whsec_AAAA=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' },
      400,
      'invalid_request',
    ],
    ['negative overlap', `/v1/groups/${group}/consumers/${id}/secret`, { overlapMs: -1 }, 400, 'invalid_request'],
    ['overlap over 7 days', `/v1/groups/${group}/consumers/${id}/secret`, { overlapMs: 604_800_001 }, 400, 'invalid_request'],
    ['fractional overlap', `/v1/groups/${group}/consumers/${id}/secret`, { overlapMs: 1.5 }, 400, 'invalid_request'],
    ['overlap as a string', `/v1/groups/${group}/consumers/${id}/secret`, { overlapMs: 'soon' }, 400, 'invalid_request'],
    ['unknown field', `/v1/groups/${group}/consumers/${id}/secret`, { secret: newSecret(), rotate: true }, 400, 'invalid_request'],
    ['not an object', `/v1/groups/${group}/consumers/${id}/secret`, [newSecret()], 400, 'invalid_request'],
  ]
  for (const [what, url, body, status, code] of cases) {
    const res = await call('POST', url, body)
    t.equal(res.status, status, what)
    t.equal(res.json?.code, code, what)
    const given = (body as { secret?: string } | null)?.secret
    const text = JSON.stringify(res.json)
    t.ok(!text.includes(secret) && (typeof given !== 'string' || !text.includes(given)), `${what}: no secret in the problem`)
  }
  t.same(await row(), before, 'the consumer row is unchanged')

  // The boundaries themselves are accepted.
  t.equal((await rotate(group, id, { overlapMs: 0 })).status, 200, 'overlapMs 0')
  const zero = await row()
  t.ok(zero.previous_secret_expires_at.getTime() <= Date.now(), 'overlap 0: the previous secret is already expired')
  t.equal((await rotate(group, id, { overlapMs: 604_800_000 })).status, 200, 'overlapMs 7 days')

  // Registration refuses the secrets rotation refuses (they would fail at push time).
  const short = await call('POST', `/v1/groups/${group}/consumers`, { url: 'http://127.0.0.1:9/x', secret: newSecret(12) })
  t.equal(short.status, 400, 'a consumer registered with a 12-byte secret is refused')
  t.equal(short.json.code, 'invalid_request')
})

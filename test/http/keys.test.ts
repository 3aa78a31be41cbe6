/**
 * Scoped API keys against a real broker and its database: the key's life (made, listed without
 * its text, stored as a digest, deleted, expired), list answers filtered to the key, the audit log
 * (ids, never keys), and what a key could do from outside before (issue 32, item 5): read or nack
 * another group's deliveries, read other topics' dead letters, forge dead-letter headers, read
 * consumer URLs with credentials; and /docs served with a Content-Security-Policy.
 */
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { createClient, replayDeadLetters } from '@hookq/client'
import pg from 'pg'
import pino from 'pino'
import t from '../helpers/tap.ts'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const ROOT = 'root-key-of-the-keys-test'
const logLines: string[] = []
const db = await testDatabase(t)
const broker = await createBroker(
  loadConfig({
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
    HOOKQ_API_KEYS: `${ROOT},env-producer:produce`,
  }),
  { logger: pino({ level: 'info' }, { write: (line: string) => void logLines.push(line) }) },
)
t.teardown(() => broker.close())
const app = broker.app

interface Answer {
  status: number
  json: any
  headers: Record<string, unknown>
  body: string
}
const call = async (key: string | undefined, method: string, url: string, payload?: object): Promise<Answer> => {
  const res = await app.inject({
    method: method as 'GET',
    url,
    headers: key ? { authorization: `Bearer ${key}` } : {},
    ...(payload ? { payload } : {}),
  })
  return { status: res.statusCode, json: res.body ? JSON.parse(res.body) : undefined, headers: res.headers, body: res.body }
}
const root = (method: string, url: string, payload?: object) => call(ROOT, method, url, payload)
const makeKey = async (name: string, scopes: object[], expiresAt?: string) => {
  const res = await root('POST', '/v1/keys', { name, scopes, ...(expiresAt ? { expiresAt } : {}) })
  if (res.status !== 201) throw new Error(`POST /v1/keys: ${res.status} ${res.body}`)
  return res.json as { id: string; key: string }
}

for (const [topic, partitions] of [
  ['orders', 1],
  ['orders.eu', 1],
  ['orders-dlq', 1],
  ['billing', 1],
  ['billing-dlq', 1],
] as const) {
  await root('PUT', `/v1/topics/${topic}`, { partitions })
}
await root('PUT', '/v1/groups/orders-g', { topic: 'orders', deadLetterTopic: 'orders-dlq' })
await root('PUT', '/v1/groups/billing-g', { topic: 'billing', deadLetterTopic: 'billing-dlq', ackTimeoutMs: 60_000 })

t.test("a key's life: made once, listed without its text, stored as a digest, deleted", async (t) => {
  const made = await root('POST', '/v1/keys', { name: 'orders-service', scopes: [{ action: 'produce', topics: ['orders*'] }] })
  t.equal(made.status, 201)
  t.match(made.json, {
    id: String,
    name: 'orders-service',
    key: /^hq_[A-Za-z0-9_-]{43}$/,
    scopes: [{ action: 'produce', topics: ['orders*'] }],
    createdAt: String,
    expiresAt: null,
  })
  const { id, key } = made.json as { id: string; key: string }

  const list = await root('GET', '/v1/keys')
  t.match(
    list.json.keys.find((k: { id: string }) => k.id === id),
    { id, name: 'orders-service', scopes: [{ action: 'produce', topics: ['orders*'] }] },
  )
  t.notOk(list.body.includes(key), 'the list never shows a key')
  t.notOk(list.json.keys.some((k: object) => 'key' in k))

  const rows = await broker.db.pool.query('SELECT id, key_hash, row_to_json(k)::text AS text FROM api_keys k WHERE id = $1', [id])
  t.same(rows.rows[0].key_hash, createHash('sha256').update(key).digest(), 'the database holds the SHA-256 of the key')
  t.notOk(rows.rows[0].text.includes(key.slice(3)), 'and not the key')

  if (databaseServerUrl) {
    // The whole database as a backup holds it: the key's text is nowhere, in any encoding.
    const dump = execFileSync('pg_dump', ['--data-only', db.url], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })
    t.match(dump, /api_keys/, 'the dump has the keys table')
    for (const form of [key, key.slice(3), Buffer.from(key).toString('hex'), Buffer.from(key.slice(3), 'base64url').toString('hex')]) {
      t.notOk(dump.includes(form), 'pg_dump holds no form of the key')
    }
  }
  t.equal((await call(key, 'POST', '/v1/topics/orders/messages', { messages: [{ value: 1 }] })).status, 201, 'the key works')
  t.equal((await root('DELETE', `/v1/keys/${id}`)).status, 204)
  const refused = await call(key, 'POST', '/v1/topics/orders/messages', { messages: [{ value: 2 }] })
  t.equal(refused.status, 401, 'a deleted key gets 401 at once on the process that deleted it')
  t.equal(refused.headers['www-authenticate'], 'Bearer error="invalid_token"')
  t.match((await root('DELETE', `/v1/keys/${id}`)).json, { status: 404, code: 'key_not_found' })
})

t.test('/v1/keys: an admin key without patterns only; bad scopes are a 400 that makes nothing', async (t) => {
  const scopedAdmin = await makeKey('scoped-admin', [{ action: 'admin', topics: ['orders*'] }])
  for (const key of [scopedAdmin.key, 'env-producer']) {
    t.equal((await call(key, 'GET', '/v1/keys')).status, 403)
    t.equal((await call(key, 'POST', '/v1/keys', { name: 'x', scopes: [{ action: 'admin' }] })).status, 403, 'no key makes a stronger key')
    t.equal((await call(key, 'DELETE', `/v1/keys/${scopedAdmin.id}`)).status, 403)
  }
  const before = (await root('GET', '/v1/keys')).json.keys.length
  for (const body of [
    { name: 'x', scopes: [] },
    { name: 'x', scopes: [{ action: 'root' }] },
    { name: 'x', scopes: [{ action: 'produce', groups: ['g'] }] },
    { name: 'x', scopes: [{ action: 'consume', groups: ['bil*ing'] }] },
    { name: 'x', scopes: [{ action: 'metrics', topics: ['t'] }] },
    { name: 'x', scopes: [{ action: 'produce' }], expiresAt: '2001-01-01T00:00:00Z' },
    { name: 'x', scopes: [{ action: 'produce' }], expiresAt: 'tomorrow' },
    { name: '', scopes: [{ action: 'produce' }] },
  ]) {
    const res = await root('POST', '/v1/keys', body)
    t.equal(res.status, 400, JSON.stringify(body))
    t.equal(res.json.code, 'invalid_request')
  }
  t.equal((await root('GET', '/v1/keys')).json.keys.length, before, 'nothing was made')
})

t.test('an expired key gets 401', async (t) => {
  const { key } = await makeKey('short-lived', [{ action: 'produce', topics: ['orders'] }], new Date(Date.now() + 1500).toISOString())
  t.equal((await call(key, 'GET', '/v1/topics/orders')).status, 200, 'valid until it expires')
  const expired = await waitUntil(
    async () => {
      const res = await call(key, 'GET', '/v1/topics/orders')
      return res.status === 401 ? res : undefined
    },
    10_000,
    'the key to expire',
  )
  t.match(expired.json, { code: 'unauthorized', detail: /expired/ })
})

t.test('list answers show only what the key may see', async (t) => {
  const names = (res: Answer, member: string) => res.json[member].map((x: { name: string }) => x.name).sort()
  const producer = await makeKey('p', [{ action: 'produce', topics: ['orders*'] }])
  t.same(names(await call(producer.key, 'GET', '/v1/topics'), 'topics'), ['orders', 'orders-dlq', 'orders.eu'])
  t.same(names(await call(producer.key, 'GET', '/v1/groups'), 'groups'), [], 'a produce key sees no group')
  const consumer = await makeKey('c', [{ action: 'consume', groups: ['billing-g'] }])
  t.same(names(await call(consumer.key, 'GET', '/v1/groups'), 'groups'), ['billing-g'])
  t.same(names(await call(consumer.key, 'GET', '/v1/topics'), 'topics'), [], 'a consume key sees no topic')
  const onTopic = await makeKey('ct', [{ action: 'consume', topics: ['orders'] }])
  t.same(names(await call(onTopic.key, 'GET', '/v1/groups'), 'groups'), ['orders-g'], "a consume scope on a topic sees the topic's groups")
  const admin = await makeKey('a', [{ action: 'admin', topics: ['billing*'] }])
  t.same(names(await call(admin.key, 'GET', '/v1/topics'), 'topics'), ['billing', 'billing-dlq'])
  t.same(names(await call(admin.key, 'GET', '/v1/groups'), 'groups'), ['billing-g'])
  t.same(
    names(await call('env-producer', 'GET', '/v1/topics'), 'topics'),
    ['billing', 'billing-dlq', 'orders', 'orders-dlq', 'orders.eu'],
    'a HOOKQ_API_KEYS produce key: every topic',
  )
})

t.test("a consume key cannot read another group's deliveries nor settle its messages", async (t) => {
  const receiver = await startReceiver(t, { status: 200 })
  await root('POST', '/v1/groups/billing-g/consumers', { url: `${receiver.url}/billing` })
  await root('POST', '/v1/topics/billing/messages', { messages: [{ value: { invoice: 1 } }] })
  const [push] = await receiver.waitFor(1, 20_000)
  const theirs = (push!.json as { deliveryId: string }).deliveryId

  const mine = await makeKey('orders-consumer', [{ action: 'consume', groups: ['orders-g'] }])
  t.equal((await call(mine.key, 'GET', '/v1/groups/orders-g/deliveries')).status, 200, 'its own log')
  t.equal((await call(mine.key, 'GET', '/v1/groups/billing-g/deliveries')).status, 403, "not another group's")
  t.equal((await call(mine.key, 'GET', '/v1/groups/billing-g')).status, 403)
  t.equal((await call(mine.key, 'POST', '/v1/groups/billing-g/nacks', { deliveryIds: [theirs], deadLetter: true })).status, 403)
  t.equal((await call(mine.key, 'POST', '/v1/groups/billing-g/acks', { deliveryIds: [theirs] })).status, 403)
  const viaOwn = await call(mine.key, 'POST', '/v1/groups/orders-g/nacks', { deliveryIds: [theirs], deadLetter: true })
  t.same(viaOwn.json.results, [{ deliveryId: theirs, status: 'unknown' }], "another group's id through its own group: unknown")
  const status = await root('GET', '/v1/groups/billing-g')
  t.match(status.json.partitions, [{ committedOffset: 0, inFlight: 1 }], 'their message is still in flight')
  t.same(
    (await root('GET', '/v1/topics/billing-dlq')).json.partitionStats,
    [{ partition: 0, startOffset: 0, endOffset: 0 }],
    'and nothing was dead-lettered',
  )
  t.equal((await root('POST', '/v1/groups/billing-g/acks', { deliveryIds: [theirs] })).json.results[0].status, 'acked')
})

t.test("a produce key reads only its topics' messages, dead letters included", async (t) => {
  const { key } = await makeKey('orders-producer', [{ action: 'produce', topics: ['orders*'] }])
  t.equal((await call(key, 'GET', '/v1/topics/orders-dlq/partitions/0/messages')).status, 200, 'its own dead-letter topic')
  for (const url of [
    '/v1/topics/billing-dlq/partitions/0/messages',
    '/v1/topics/billing-dlq',
    '/v1/topics/billing/partitions/0/messages',
  ]) {
    const res = await call(key, 'GET', url)
    t.equal(res.status, 403, url)
    t.match(res.json, { code: 'forbidden', detail: /produce on topic billing/ })
  }
  t.equal((await call(key, 'POST', '/v1/topics/billing/messages', { messages: [{ value: 1 }] })).status, 403)
})

t.test('produce refuses hookq-dlq-* headers, so a replay trusts only what the broker wrote', async (t) => {
  const { key } = await makeKey('dlq-writer', [{ action: 'produce', topics: ['orders-dlq'] }])
  for (const name of ['hookq-dlq-topic', 'Hookq-DLQ-Topic', 'hookq-dlq-anything']) {
    const res = await call(key, 'POST', '/v1/topics/orders-dlq/messages', {
      messages: [{ value: 'ok' }, { value: 'forged', headers: { [name]: 'billing', 'hookq-dlq-partition': '0' } }],
    })
    t.equal(res.status, 400, name)
    t.match(res.json, { code: 'invalid_request', index: 1, detail: /broker's own/ })
  }
  t.equal(
    (
      await call(key, 'POST', '/v1/topics/orders-dlq/messages', {
        messages: [{ value: 'plain', headers: { 'hookq-dlqx': 'y', 'x-hookq-dlq-topic': 'z' } }],
      })
    ).status,
    201,
    'other names pass',
  )
  // The operator's replay of that dead-letter topic finds nothing to send anywhere.
  const client = createClient({ baseUrl: 'http://hookq.invalid', apiKey: ROOT, fetch: (req: Request) => injectFetch(req) })
  const summary = await replayDeadLetters(client, 'orders-dlq')
  t.match(summary, { read: 1, replayed: 0, skipped: 1 }, 'the plain message is not a dead letter')
  t.same((await root('GET', '/v1/topics/billing')).json.partitionStats[0].endOffset, 1, 'billing got nothing from the replay')
})

t.test('consumer URLs: whole for the group admin, query values hidden from a consume key', async (t) => {
  const url = 'http://127.0.0.1:9/in?token=s3cret-token&v=2#frag'
  const added = await root('POST', '/v1/groups/orders-g/consumers', { url })
  t.equal(added.status, 201)
  const consumeKey = await makeKey('oc', [{ action: 'consume', groups: ['orders-g'] }])
  const seen = await call(consumeKey.key, 'GET', '/v1/groups/orders-g')
  t.equal(seen.status, 200)
  const shown = seen.json.consumers.find((c: { id: string }) => c.id === added.json.id).url
  t.equal(shown, 'http://127.0.0.1:9/in?token=***&v=***#***')
  t.notOk(/s3cret|frag/.test(seen.body), 'no credential in the answer')
  const groupAdmin = await makeKey('oa', [{ action: 'admin', groups: ['orders-g'] }])
  t.equal(
    (await call(groupAdmin.key, 'GET', '/v1/groups/orders-g')).json.consumers.find((c: { id: string }) => c.id === added.json.id).url,
    url,
    'the group admin sees it whole',
  )
  t.equal((await call(consumeKey.key, 'GET', '/v1/groups/orders-g/consumers')).status, 403, 'the consumer list is an admin route')
  await root('DELETE', `/v1/groups/orders-g/consumers/${added.json.id}`)
})

t.test('an admin for some topics cannot point a group at, or dead-letter into, another topic', async (t) => {
  const { key } = await makeKey('orders-admin', [{ action: 'admin', topics: ['orders*'] }])
  t.equal((await call(key, 'PUT', '/v1/groups/orders-new', { topic: 'orders' })).status, 201)
  t.equal(
    (await call(key, 'PUT', '/v1/groups/orders-new', { topic: 'orders', deadLetterTopic: 'billing' })).status,
    403,
    'a dead-letter topic outside its patterns',
  )
  t.equal((await call(key, 'PUT', '/v1/groups/sneaky', { topic: 'billing' })).status, 403, 'a group on a topic outside its patterns')
  t.equal((await call(key, 'DELETE', '/v1/groups/billing-g')).status, 403)
  t.equal((await call(key, 'DELETE', '/v1/groups/orders-new')).status, 204)
  const groupAdmin = await makeKey('group-admin', [{ action: 'admin', groups: ['billing-g'] }])
  t.equal((await call(groupAdmin.key, 'DELETE', '/v1/topics/orders.eu')).status, 403, 'a group admin does not administer topics')
  t.equal((await call(groupAdmin.key, 'POST', '/v1/groups/billing-g/seek', { offset: 0 })).status, 200)
})

t.test('an admin for some groups cannot point its groups at a topic: that reads the topic', async (t) => {
  const { key } = await makeKey('billing-groups-admin', [{ action: 'admin', groups: ['billing*'] }])
  const made = await call(key, 'PUT', '/v1/groups/billing-new', { topic: 'orders' })
  t.equal(made.status, 403, 'a new group of its pattern on any topic: 403')
  t.match(made.json, { code: 'forbidden', detail: /admin on group billing-new on topics orders/ })
  t.equal((await root('GET', '/v1/groups/billing-new')).status, 404, 'nothing made')
  t.equal(
    (await call(key, 'PUT', '/v1/groups/billing-g', { topic: 'billing', deadLetterTopic: 'orders' })).status,
    403,
    'nor a dead-letter topic it does not administer',
  )
  t.equal(
    (await call(key, 'PUT', '/v1/groups/billing-g', { topic: 'billing', deadLetterTopic: 'billing-dlq', ackTimeoutMs: 60_000 })).status,
    200,
    'the topics the group has already: its settings may change',
  )
  const both = await makeKey('billing-both', [
    { action: 'admin', groups: ['billing*'] },
    { action: 'admin', topics: ['billing*'] },
  ])
  t.equal((await call(both.key, 'PUT', '/v1/groups/billing-new', { topic: 'billing' })).status, 201, 'with admin on the topic too: made')
  t.equal((await call(both.key, 'PUT', '/v1/groups/billing-other', { topic: 'orders' })).status, 403, 'but not on another topic')
  t.equal((await root('DELETE', '/v1/groups/billing-new')).status, 204)
})

t.test('schedules: an admin for some topics manages the schedules of those topics', async (t) => {
  const { key } = await makeKey('orders-scheduler', [{ action: 'admin', topics: ['orders*'] }])
  const tick = { every: 3_600_000, message: { value: 1 } }
  t.equal((await call(key, 'PUT', '/v1/schedules/orders-hourly', { topic: 'orders', ...tick })).status, 201, 'on its topic')
  t.equal((await call(key, 'GET', '/v1/schedules/orders-hourly')).status, 200)
  t.equal((await call(key, 'PUT', '/v1/schedules/billing-hourly', { topic: 'billing', ...tick })).status, 403, 'on another topic: 403')
  t.equal((await root('PUT', '/v1/schedules/billing-hourly', { topic: 'billing', ...tick })).status, 201)
  for (const [method, body] of [
    ['GET', undefined],
    ['DELETE', undefined],
    ['PUT', { topic: 'orders', ...tick }],
  ] as const) {
    t.equal((await call(key, method, '/v1/schedules/billing-hourly', body)).status, 403, `${method} of a schedule of another topic`)
  }
  t.equal((await root('GET', '/v1/schedules/billing-hourly')).json.topic, 'billing', 'the other schedule is untouched')
  const listed = (await call(key, 'GET', '/v1/schedules')).json.schedules.map((x: { name: string }) => x.name)
  t.same(listed, ['orders-hourly'], 'the list shows the schedules of its topics only')
  const groupAdmin = await makeKey('schedule-group-admin', [{ action: 'admin', groups: ['*'] }])
  t.equal(
    (await call(groupAdmin.key, 'PUT', '/v1/schedules/g', { topic: 'orders', ...tick })).status,
    403,
    'a group admin has no schedules',
  )
  t.equal((await call(key, 'DELETE', '/v1/schedules/orders-hourly')).status, 204)
  t.equal((await root('DELETE', '/v1/schedules/billing-hourly')).status, 204)
})

t.test('the audit log: key creation, deletion and admin writes, with ids and never a key', async (t) => {
  logLines.length = 0
  const made = await makeKey('audited', [{ action: 'admin', topics: ['audit*'] }])
  t.equal((await call(made.key, 'PUT', '/v1/topics/audit-1', { partitions: 1 })).status, 201)
  t.equal((await root('DELETE', '/v1/topics/audit-1')).status, 204)
  t.equal((await call(made.key, 'GET', '/v1/topics/audit-x')).status, 404, 'reads are not audited')
  t.equal((await root('DELETE', `/v1/keys/${made.id}`)).status, 204)
  const audit = logLines.map((l) => JSON.parse(l)).filter((l) => l.audit)
  t.match(audit, [
    { audit: 'key_created', keyId: made.id, byKeyId: 'env:1', msg: 'API key created' },
    { audit: 'admin_write', keyId: 'env:1', method: 'POST', route: '/v1/keys', statusCode: 201 },
    { audit: 'admin_write', keyId: made.id, method: 'PUT', route: '/v1/topics/:topic', url: '/v1/topics/audit-1', statusCode: 201 },
    { audit: 'admin_write', keyId: 'env:1', method: 'DELETE', url: '/v1/topics/audit-1', statusCode: 204 },
    { audit: 'key_deleted', keyId: made.id, byKeyId: 'env:1' },
    { audit: 'admin_write', keyId: 'env:1', method: 'DELETE', route: '/v1/keys/:id', statusCode: 204 },
  ])
  t.equal(audit.length, 6)
  const all = logLines.join('\n')
  t.notOk(all.includes(made.key.slice(3)), 'no log line holds the made key')
  t.notOk(all.includes(ROOT), 'nor the root key')
})

t.test('/docs is served with a Content-Security-Policy and still renders', async (t) => {
  for (const url of ['/docs', '/docs/', '/docs/static/swagger-initializer.js']) {
    const res = await app.inject({ url })
    const csp = String(res.headers['content-security-policy'] ?? '')
    t.match(csp, /default-src 'none'/, `${url}: ${res.statusCode}`)
    t.match(csp, /script-src 'self'(;|$)/, 'no inline or remote script')
    t.match(csp, /frame-ancestors 'none'/)
  }
  const page = await app.inject({ url: '/docs/' })
  t.equal(page.statusCode, 200)
  t.match(page.body, /<div id="swagger-ui"><\/div>/)
  t.notMatch(page.body, /<script>(?!\s*<\/script>)|<script\s+(?![^>]*src=)/, 'the page has no inline script the policy would block')
  t.equal((await app.inject({ url: '/docs/json' })).statusCode, 200, 'the document it fetches')
})

/** fetch through app.inject, for the SDK. */
async function injectFetch(req: Request): Promise<Response> {
  const url = new URL(req.url)
  const body = req.body === null ? undefined : await req.text()
  const res = await app.inject({
    method: req.method as 'GET',
    url: url.pathname + url.search,
    headers: Object.fromEntries(req.headers),
    ...(body === undefined ? {} : { payload: body }),
  })
  return new Response(res.statusCode === 204 ? null : res.body, { status: res.statusCode, headers: res.headers as Record<string, string> })
}

t.test('without HOOKQ_API_KEYS: /v1/keys answers 403, and keys stored earlier are said to be ignored', async (t) => {
  const other = await testDatabase(t)
  const client = new pg.Client({ connectionString: other.url })
  await client.connect()
  await client.query(`INSERT INTO api_keys (id, name, key_hash, scopes) VALUES ('k-old', 'old', $1, '[{"action":"admin"}]')`, [
    createHash('sha256').update('hq_old').digest(),
  ])
  await client.end()
  const said: string[] = []
  const open = await createBroker(loadConfig({ DATABASE_URL: other.url, HOOKQ_DB_POOL_SIZE: String(Math.min(other.maxConnections, 4)) }), {
    log: (m) => said.push(m),
  })
  t.teardown(() => open.close())
  t.ok(
    said.some((m) => /^WARNING: 1 API key\(s\) made with POST \/v1\/keys are ignored: HOOKQ_API_KEYS is unset/.test(m)),
    `the start-up says so: ${said.join(' | ')}`,
  )
  const res = await open.app.inject({ method: 'POST', url: '/v1/keys', payload: { name: 'x', scopes: [{ action: 'produce' }] } })
  t.equal(res.statusCode, 403)
  t.match(res.json(), { code: 'forbidden', detail: /only when authentication is on \(HOOKQ_API_KEYS\); it is off/ })
  t.equal((await open.app.inject({ url: '/v1/topics', headers: { authorization: 'Bearer hq_old' } })).statusCode, 200, 'the API is open')
})

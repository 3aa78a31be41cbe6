import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from '../helpers/tap.ts'
import { loadConfig } from '../../src/config.ts'
import { startBroker } from '../helpers/broker.ts'
import { type TestDatabase, testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

const KEYS = 'pk_live_abc:produce,ck_live_def:consume,ak_root:admin,plain_old,both_k:produce+consume'
const bearer = (key: string) => ({ authorization: `Bearer ${key}` })

// Each subtest needs a broker configured its own way, but they take one database in turn (each
// broker closes at the end of its subtest): a database costs ~1 s of CPU embedded. The subtests
// use topics of their own; the first lists the topics, so it stays first.
let shared: Promise<TestDatabase> | undefined
const db = () => (shared ??= testDatabase(t))

t.test('scopes against representative routes', async (t) => {
  const { app } = await startBroker(t, { HOOKQ_API_KEYS: KEYS }, { db: await db() })
  const call = async (key: string | undefined, method: string, url: string, payload?: object) => {
    const res = await app.inject({ method: method as 'GET', url, headers: key ? bearer(key) : {}, ...(payload ? { payload } : {}) })
    return { status: res.statusCode, json: res.body ? res.json() : undefined, headers: res.headers }
  }
  const msg = { messages: [{ value: { n: 1 } }] }
  const ids = { deliveryIds: ['nope'] }

  // admin (written out, and a plain key without scopes) can do everything
  t.equal((await call('ak_root', 'PUT', '/v1/topics/orders', { partitions: 1 })).status, 201)
  t.equal((await call('plain_old', 'PUT', '/v1/groups/billing', { topic: 'orders' })).status, 201)
  t.equal((await call('ak_root', 'POST', '/v1/topics/orders/messages', msg)).status, 201)
  t.equal((await call('plain_old', 'POST', '/v1/groups/billing/acks', ids)).status, 200)
  t.equal((await call('ak_root', 'POST', '/v1/groups/billing/seek', { offset: 0 })).status, 200)
  t.equal((await call('ak_root', 'GET', '/v1/groups')).status, 200)

  // produce: produce and fetch messages; nothing else
  t.equal((await call('pk_live_abc', 'POST', '/v1/topics/orders/messages', msg)).status, 201)
  t.equal((await call('pk_live_abc', 'GET', '/v1/topics/orders/partitions/0/messages?fromOffset=0')).json.messages.length, 2)
  t.match(
    (await call('pk_live_abc', 'GET', '/v1/topics/orders')).json,
    { name: 'orders', partitionStats: [{ partition: 0, endOffset: 2 }] },
    'a produce key reads a topic: its partitions and end offsets',
  )
  const denied = await call('pk_live_abc', 'PUT', '/v1/topics/other', { partitions: 1 })
  t.equal(denied.status, 403, 'a produce key cannot create topics')
  t.match(denied.headers['content-type'], /application\/problem\+json/)
  t.match(denied.json, {
    code: 'forbidden',
    status: 403,
    requiredScope: 'admin',
    detail: /needs admin for PUT \/v1\/topics\/:topic \(it has produce\)/,
  })
  t.equal((await call('ak_root', 'GET', '/v1/topics/other')).status, 404, 'the forbidden call wrote nothing')
  t.same(
    (await call('pk_live_abc', 'GET', '/v1/topics')).json.topics.map((x: { name: string }) => x.name),
    ['orders'],
    'a produce key without patterns lists every topic',
  )
  for (const [method, url, body] of [
    ['DELETE', '/v1/topics/orders'],
    ['POST', '/v1/groups/billing/acks', ids],
    ['GET', '/v1/groups/billing'],
    ['POST', '/v1/groups/billing/consumers', { url: 'http://127.0.0.1:1/' }],
    ['POST', '/v1/groups/billing/seek', { offset: 0 }],
  ] as [string, string, object?][]) {
    t.equal((await call('pk_live_abc', method, url, body)).status, 403, `produce key: ${method} ${url}`)
  }

  // consume: acks, nacks, extend, group status and deliveries; not produce, not admin
  t.match((await call('ck_live_def', 'POST', '/v1/groups/billing/acks', ids)).json, {
    results: [{ deliveryId: 'nope', status: 'unknown' }],
  })
  t.equal((await call('ck_live_def', 'POST', '/v1/groups/billing/nacks', ids)).status, 200)
  t.equal((await call('ck_live_def', 'POST', '/v1/groups/billing/extend', { ...ids, extendMs: 1000 })).status, 200)
  t.match((await call('ck_live_def', 'GET', '/v1/groups/billing')).json, { name: 'billing', topic: 'orders' })
  t.equal((await call('ck_live_def', 'HEAD', '/v1/groups/billing')).status, 200, 'HEAD follows GET')
  t.equal((await call('ck_live_def', 'GET', '/v1/groups/billing/deliveries')).status, 200)
  const noProduce = await call('ck_live_def', 'POST', '/v1/topics/orders/messages', msg)
  t.equal(noProduce.status, 403, 'a consume key cannot produce')
  t.match(noProduce.json, { code: 'forbidden', requiredScope: 'produce' })
  t.equal((await call('ck_live_def', 'GET', '/v1/topics/orders/partitions/0/messages')).status, 403)
  t.equal((await call('ck_live_def', 'GET', '/v1/topics/orders')).status, 403, 'a consume key does not read topics')
  t.equal((await call('ck_live_def', 'DELETE', '/v1/groups/billing')).status, 403)
  t.equal((await call('ck_live_def', 'POST', '/v1/groups/billing/seek', { offset: 0 })).status, 403)

  // several scopes on one key
  t.equal((await call('both_k', 'POST', '/v1/topics/orders/messages', msg)).status, 201)
  t.equal((await call('both_k', 'POST', '/v1/groups/billing/acks', ids)).status, 200)
  t.equal((await call('both_k', 'DELETE', '/v1/groups/billing')).status, 403)

  // no key, unknown key, wrong scheme: 401 with www-authenticate, before anything else (validation included)
  const missing = await call(undefined, 'POST', '/v1/topics/orders/messages', { not: 'valid' })
  t.equal(missing.status, 401)
  t.equal(missing.json.code, 'unauthorized')
  t.equal(missing.headers['www-authenticate'], 'Bearer')
  const unknown = await call('pk_live_abX', 'GET', '/v1/groups/billing')
  t.equal(unknown.status, 401)
  t.equal(unknown.json.code, 'unauthorized')
  t.equal(unknown.headers['www-authenticate'], 'Bearer error="invalid_token"')
  const basic = await app.inject({ url: '/v1/topics', headers: { authorization: 'Basic ak_root' } })
  t.equal(basic.statusCode, 401)
  t.equal(basic.headers['www-authenticate'], 'Bearer')
  t.equal((await call('ak_root:admin', 'GET', '/v1/topics')).status, 401, 'the scope suffix is not part of the key')

  // open routes
  for (const url of ['/healthz', '/readyz', '/openapi.json', '/docs/']) {
    t.equal((await app.inject({ url })).statusCode, 200, `${url} is open`)
  }
  t.equal((await app.inject({ url: '/metrics' })).statusCode, 401, '/metrics needs a key when keys are configured')
  t.equal((await app.inject({ url: '/metrics', headers: bearer('ak_root') })).statusCode, 200, 'an admin key scrapes')
  t.equal((await call('pk_live_abc', 'GET', '/metrics')).status, 403, 'a produce key does not')
  t.equal(
    (await app.inject({ url: '/v1/no/such/route' })).statusCode,
    404,
    'an unknown route is a 404 (the routes are public in /openapi.json)',
  )
})

t.test('keys file and configuration errors', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'hookq-keys-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'keys')
  await writeFile(
    file,
    [
      '# hookq API keys',
      '',
      'pk_file:produce   # the order service',
      '  ck_file:consume+produce',
      'ak_file',
      'with:colon:admin',
      'hash#inside:consume',
    ].join('\n'),
  )
  const c = loadConfig({ HOOKQ_API_KEYS: 'env_key:consume', HOOKQ_API_KEYS_FILE: file })
  t.same(c.apiKeys, [
    { key: 'env_key', scopes: ['consume'] },
    { key: 'pk_file', scopes: ['produce'] },
    { key: 'ck_file', scopes: ['consume', 'produce'] },
    { key: 'ak_file', scopes: ['admin'] },
    { key: 'with:colon', scopes: ['admin'] },
    { key: 'hash#inside', scopes: ['consume'] },
  ])
  t.equal(loadConfig({}).rateLimitPerKey, 0, 'no rate limit by default')

  const bad: [Record<string, string>, RegExp][] = [
    [{ HOOKQ_API_KEYS: 'k1:produce,k2:write' }, /HOOKQ_API_KEYS: unknown scope "write" \(scopes are produce, consume, admin/],
    [{ HOOKQ_API_KEYS: 'k1:' }, /unknown scope ""/],
    [{ HOOKQ_API_KEYS: ':admin' }, /HOOKQ_API_KEYS: an entry has an empty key/],
    [{ HOOKQ_API_KEYS: 'k1:produce,k1:admin' }, /listed twice with different scopes/],
    [{ HOOKQ_API_KEYS_FILE: join(dir, 'missing') }, /HOOKQ_API_KEYS_FILE: cannot read/],
    [{ HOOKQ_RATE_LIMIT_PER_KEY: 'fast' }, /HOOKQ_RATE_LIMIT_PER_KEY must be a whole number/],
  ]
  for (const [env, message] of bad) t.throws(() => loadConfig(env), { name: 'ConfigError', message }, JSON.stringify(env))
  await writeFile(join(dir, 'bad'), 'good:produce\n\nk key:consume\n')
  t.throws(() => loadConfig({ HOOKQ_API_KEYS_FILE: join(dir, 'bad') }), {
    name: 'ConfigError',
    message: /line 3: a key must not contain whitespace/,
  })
  await writeFile(join(dir, 'bad'), 'good:produce\nk:root\n')
  t.throws(() => loadConfig({ HOOKQ_API_KEYS_FILE: join(dir, 'bad') }), { name: 'ConfigError', message: /line 2: unknown scope "root"/ })
  t.equal(
    loadConfig({ HOOKQ_API_KEYS: 'ak_file,pk_file:produce', HOOKQ_API_KEYS_FILE: file }).apiKeys.length,
    5,
    'a key listed twice with the same scopes counts once',
  )
  t.throws(
    () => loadConfig({ HOOKQ_API_KEYS: 'other,pk_file:admin', HOOKQ_API_KEYS_FILE: file }),
    {
      name: 'ConfigError',
      message: `the API key "p…" (7 characters) is listed twice with different scopes: in HOOKQ_API_KEYS entry 2 (admin) and in HOOKQ_API_KEYS_FILE (${file}) line 3 (produce)`,
    },
    'a key listed twice is named by where it is, not by its whole text',
  )

  // a broker configured from the file accepts its keys
  const { app } = await startBroker(t, { HOOKQ_API_KEYS_FILE: file }, { db: await db() })
  t.equal(
    (await app.inject({ method: 'PUT', url: '/v1/topics/f', payload: { partitions: 1 }, headers: bearer('ak_file') })).statusCode,
    201,
  )
  t.equal(
    (await app.inject({ method: 'POST', url: '/v1/topics/f/messages', payload: { messages: [{ value: 1 }] }, headers: bearer('pk_file') }))
      .statusCode,
    201,
  )
  t.equal(
    (await app.inject({ method: 'PUT', url: '/v1/topics/g', payload: { partitions: 1 }, headers: bearer('pk_file') })).statusCode,
    403,
  )
  t.equal((await app.inject({ url: '/v1/topics', headers: bearer('with:colon') })).statusCode, 200)
})

t.test('rate limit per key: a burst gets 429 with Retry-After, then calls pass again', async (t) => {
  const { app } = await startBroker(
    t,
    { HOOKQ_API_KEYS: 'fast_one:admin,fast_two:produce', HOOKQ_RATE_LIMIT_PER_KEY: '5' },
    { db: await db() },
  )
  const get = (key: string) => app.inject({ url: '/v1/topics', headers: bearer(key) })
  const started = performance.now()
  const answers = await Promise.all(Array.from({ length: 20 }, () => get('fast_one')))
  const elapsedMs = performance.now() - started
  const ok = answers.filter((a) => a.statusCode === 200)
  const limited = answers.filter((a) => a.statusCode === 429)
  t.equal(ok.length + limited.length, 20, 'every call is either served or limited')
  // The bucket holds 2 × 5 and refills one call per 200 ms: a slow machine that takes longer over
  // the 20 calls earns the limiter more, never less.
  const most = 10 + Math.ceil(elapsedMs / 200)
  t.ok(
    ok.length >= 10 && ok.length <= most,
    `the burst (2 × 5) is served, and no more than refilled meanwhile (${most}): ${ok.length} in ${elapsedMs.toFixed(0)} ms`,
  )
  t.ok(limited.length >= 20 - most && limited.length > 0, `the rest is limited: ${limited.length}`)
  const first = limited[0]!
  t.equal(first.headers['retry-after'], '1', 'Retry-After in whole seconds, rounded up')
  t.match(first.headers['content-type'], /application\/problem\+json/)
  t.match(first.json(), { code: 'rate_limited', status: 429 })

  const other = await app.inject({
    method: 'POST',
    url: '/v1/topics/none/messages',
    payload: { messages: [{ value: 1 }] },
    headers: bearer('fast_two'),
  })
  t.equal(other.statusCode, 404, 'another key has its own bucket')
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200, 'open routes are not limited')
  const anon = await app.inject({ url: '/v1/topics' })
  t.equal(anon.statusCode, 401, 'an unknown caller is refused, not counted against a key')

  await waitUntil(async () => (await get('fast_one')).statusCode === 200, 5_000, 'the bucket to refill')
  t.pass('calls succeed again after waiting')
})

t.test('rate limit per client IP when no keys are configured', async (t) => {
  const { app } = await startBroker(t, { HOOKQ_RATE_LIMIT_PER_KEY: '5' }, { db: await db() })
  const get = (ip: string) => app.inject({ url: '/v1/topics', remoteAddress: ip })
  const answers = await Promise.all(Array.from({ length: 20 }, () => get('10.0.0.1')))
  t.ok(
    answers.some((a) => a.statusCode === 429),
    'the burst from one address is limited',
  )
  t.ok(answers.filter((a) => a.statusCode === 200).length >= 10)
  t.equal((await get('10.0.0.2')).statusCode, 200, 'another address has its own bucket')
  await waitUntil(async () => (await get('10.0.0.1')).statusCode === 200, 5_000, 'the bucket to refill')
  t.pass('calls succeed again after waiting')
})

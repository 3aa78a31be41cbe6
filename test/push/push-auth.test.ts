/**
 * Push authentication per consumer (contract v1.2): static headers, broker-signed JWTs verified with
 * jose against the broker's own /.well-known/jwks.json (after a key rotation too), and OAuth 2.0
 * client credentials against a real token endpoint that is slow, down, garbled, short-lived, or
 * whose token the consumer refuses. Secret values never appear in answers, log lines, or the
 * database (a secrets key is configured). One broker for the file; each case its own topic and group.
 */
import { execFileSync } from 'node:child_process'
import http from 'node:http'
import type net from 'node:net'
import { Writable } from 'node:stream'
import t from '../helpers/tap.ts'
import pino from 'pino'
import { createRemoteJWKSet, decodeProtectedHeader, jwtVerify } from 'jose'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { rotateSigningKey } from '../../src/dispatch/jwt-keys.ts'
import { SecretBox } from '../../src/security/secrets.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli } from '../cli/run.ts'

const KEY = Buffer.alloc(32, 7)
const logLines: string[] = []
const sink = new Writable({
  write(chunk: Buffer, _enc, done) {
    logLines.push(chunk.toString('utf8'))
    done()
  },
})
const db = await testDatabase(t)
const broker = await createBroker(
  loadConfig({
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
    HOOKQ_SECRETS_KEY: KEY.toString('base64'),
    HOOKQ_OAUTH_TIMEOUT_MS: '2000',
    HOOKQ_JWT_KEYS_REFRESH_MS: '100',
    HOOKQ_PUBLIC_URL: 'https://hookq.test',
    LOG_LEVEL: 'debug',
  }),
  { logger: pino({ level: 'debug' }, sink) },
)
t.teardown(() => broker.close())
const brokerUrl = await broker.app.listen({ host: '127.0.0.1', port: 0 })
const { call, produce, sql } = api(broker)

/** Every secret value the file registers: none may show up in an answer, a log line or a table. */
const SECRETS = ['hdr-value-3f9a1c', 'second-hdr-value-77', 'client-secret-5e2b9d', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw']

/** A topic with one partition and a group on it, fast retries, one attempt unless said. */
async function group(name: string, settings: Record<string, unknown> = {}) {
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 1 })).status, 201)
  t.equal((await call('PUT', `/v1/groups/${name}`, { topic: name, ackMode: 'auto', maxDeliveries: 1, ...settings })).status, 201)
}

async function deliveries(name: string): Promise<{ statusCode: number | null; error: string | null; outcome: string }[]> {
  return (await call('GET', `/v1/groups/${name}/deliveries?limit=100`)).json.deliveries
}

/** A token a token endpoint answered in a form the broker does not take. */
const LEAKY_TOKEN = 'leaky-token-0d4b7e91'
/** A token endpoint: each path its own behaviour; counts requests per path and keeps their bodies. */
const tokenRequests: { path: string; body: string; authorization: string | undefined }[] = []
let issued = 0
const tokenBehaviour: Record<string, (res: http.ServerResponse) => void> = {
  '/token': (res) => {
    issued++
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ access_token: `tok-${issued}`, token_type: 'Bearer', expires_in: 3600 }))
  },
  '/short': (res) => {
    issued++
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ access_token: `short-${issued}`, token_type: 'bearer', expires_in: 1 }))
  },
  '/garbage': (res) => res.end('<html>not a token</html>'),
  '/no-token': (res) => res.end('{"error":"nope"}'),
  '/slow': () => {}, // never answers
  // 2xx answers that hold a token the broker cannot use: their text must never reach the attempt log.
  '/form': (res) => {
    res.setHeader('content-type', 'application/x-www-form-urlencoded')
    res.end(`access_token=${LEAKY_TOKEN}&token_type=bearer&expires_in=3600`)
  },
  '/mac': (res) => {
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ access_token: LEAKY_TOKEN, token_type: 'mac', expires_in: 3600 }))
  },
  '/token-no-json-type': (res) => res.end(`{"access_token":"${LEAKY_TOKEN}","token_type":"bearer",`),
}
const sockets = new Set<net.Socket>()
const tokenServer = http.createServer((req, res) => {
  let body = ''
  req.on('data', (c) => {
    body += c
  })
  req.on('end', () => {
    const path = req.url ?? ''
    tokenRequests.push({ path, body, authorization: req.headers.authorization })
    // Slow enough that several pushes wait on one request.
    setTimeout(() => (tokenBehaviour[path] ?? ((r) => r.writeHead(404).end()))(res), 50)
  })
})
tokenServer.on('connection', (s) => {
  sockets.add(s)
  s.on('close', () => sockets.delete(s))
})
await new Promise<void>((resolve) => tokenServer.listen(0, '127.0.0.1', resolve))
t.teardown(() => {
  for (const s of sockets) s.destroy()
  tokenServer.close()
})
const tokenBase = `http://127.0.0.1:${(tokenServer.address() as net.AddressInfo).port}`

t.test('headers: sent with every push; reserved names refused with 400, changing nothing; values never shown', async (t) => {
  await group('hdr')
  const receiver = await startReceiver(t)
  const add = await call('POST', '/v1/groups/hdr/consumers', {
    url: `${receiver.url}/in`,
    secret: SECRETS[3],
    auth: { type: 'headers', headers: { 'X-Api-Key': SECRETS[0], authorization: `Token ${SECRETS[1]}` } },
  })
  t.equal(add.status, 201, JSON.stringify(add.json))
  t.same(add.json.auth, { type: 'headers', headerNames: ['x-api-key', 'authorization'] }, 'names shown, values not')
  await produce('hdr', [{ value: 1 }, { value: 2 }])
  const got = await receiver.waitFor(2)
  for (const r of got) {
    t.equal(r.headers['x-api-key'], SECRETS[0])
    t.equal(r.headers.authorization, `Token ${SECRETS[1]}`)
    t.ok(r.headers['webhook-signature'], 'still signed')
  }
  for (const bad of [
    { 'content-type': 'text/plain' },
    { 'Content-Length': '3' },
    { Host: 'evil' },
    { 'webhook-signature': 'v1,x' },
    { 'transfer-encoding': 'chunked' },
    Object.fromEntries(Array.from({ length: 21 }, (_, i) => [`x-h${i}`, 'v'])),
    { 'x-ok': 'line\r\nbreak' },
  ]) {
    const res = await call('POST', '/v1/groups/hdr/consumers', { url: `${receiver.url}/other`, auth: { type: 'headers', headers: bad } })
    t.equal(res.status, 400, `refused: ${Object.keys(bad)[0]}`)
    t.notOk(JSON.stringify(res.json).includes('line\r\nbreak'), 'a refused value is not quoted back')
    const patch = await call('PATCH', `/v1/groups/hdr/consumers/${add.json.id}`, { auth: { type: 'headers', headers: bad } })
    t.equal(patch.status, 400)
  }
  const list = await call('GET', '/v1/groups/hdr/consumers')
  t.equal(list.json.consumers.length, 1, 'nothing registered by the refused calls')
  t.same(list.json.consumers[0].auth.headerNames, ['x-api-key', 'authorization'], 'auth unchanged by the refused patches')
  const status = await call('GET', '/v1/groups/hdr')
  for (const answer of [add, list, status]) {
    for (const s of SECRETS) t.notOk(JSON.stringify(answer.json).includes(s), 'no secret value in an answer')
  }
})

t.test('jwt: verified by jose with the broker JWKS, before and after a rotation', async (t) => {
  await group('jwt')
  const receiver = await startReceiver(t)
  const add = await call('POST', '/v1/groups/jwt/consumers', { url: `${receiver.url}/hook`, auth: { type: 'jwt' } })
  t.equal(add.status, 201)
  t.same(add.json.auth, { type: 'jwt', audience: null })
  const jwksUrl = new URL('/.well-known/jwks.json', brokerUrl)
  const verify = async (authorization: string | undefined) => {
    t.match(authorization, /^Bearer /)
    const token = authorization!.slice('Bearer '.length)
    const { payload, protectedHeader } = await jwtVerify(token, createRemoteJWKSet(jwksUrl), {
      issuer: 'https://hookq.test',
      audience: `${receiver.url}/hook`,
      subject: 'jwt',
    })
    t.ok(payload.jti && payload.iat && payload.exp, 'jti, iat, exp')
    t.ok(payload.exp! - payload.iat! <= 3600, 'exp at most 1 hour after iat')
    return protectedHeader.kid!
  }
  await produce('jwt', [{ value: 'a' }])
  const first = (await receiver.waitFor(1))[0]!
  const oldKid = await verify(first.headers.authorization)

  const rotated = await rotateSigningKey(broker.db, new SecretBox(KEY), { propagationMs: 1500 })
  t.not(rotated.kid, oldKid)
  await waitUntil(
    async () => ((await (await fetch(jwksUrl)).json()) as { keys: { kid: string }[] }).keys.some((k) => k.kid === rotated.kid),
    1000,
    'the new key listed',
  )
  t.ok(Date.now() < rotated.signFrom.getTime(), 'the new key is listed before it signs')
  // Pushes until one carries the new key (after signFrom and this process's refresh).
  let n = 1
  const newest = await waitUntil(
    async () => {
      await produce('jwt', [{ value: n++ }])
      const r = await receiver.waitFor(n)
      const last = r[r.length - 1]!
      return decodeProtectedHeader(last.headers.authorization!.slice(7)).kid === rotated.kid ? last : undefined
    },
    15_000,
    'a push signed with the new key',
  )
  t.equal(await verify(newest.headers.authorization), rotated.kid, 'the new key verifies with a fresh JWKS')
  const after = (await (await fetch(jwksUrl)).json()) as { keys: { kid: string }[] }
  t.ok(
    after.keys.some((k) => k.kid === oldKid),
    'the old key stays listed while its tokens live',
  )
  t.ok((await verify(first.headers.authorization)) === oldKid, 'a token of the old key still verifies after the rotation')
  for (const k of after.keys) t.notOk('d' in k, 'no private part in the JWKS')
})

t.test('oauth2: one token request for many concurrent pushes, bearer sent, secret never shown', async (t) => {
  await group('oa', { maxInFlight: 50 })
  const receiver = await startReceiver(t)
  const add = await call('POST', '/v1/groups/oa/consumers', {
    url: `${receiver.url}/x`,
    auth: { type: 'oauth2', tokenUrl: `${tokenBase}/token`, clientId: 'hookq-client', clientSecret: SECRETS[2], scope: 'push' },
  })
  t.equal(add.status, 201)
  t.same(add.json.auth, { type: 'oauth2', tokenUrl: `${tokenBase}/token`, clientId: 'hookq-client', scope: 'push' })
  const before = tokenRequests.length
  await produce(
    'oa',
    Array.from({ length: 30 }, (_, i) => ({ value: i })),
  )
  const got = await receiver.waitFor(30)
  const mine = tokenRequests.slice(before)
  t.equal(mine.length, 1, 'one token request for 30 pushes')
  t.match(mine[0]!.body, /grant_type=client_credentials/)
  t.match(mine[0]!.body, /scope=push/)
  t.equal(mine[0]!.authorization, `Basic ${Buffer.from(`hookq-client:${SECRETS[2]}`).toString('base64')}`)
  const bearers = new Set(got.map((r) => r.headers.authorization))
  t.equal(bearers.size, 1, 'every push carried the one token')
  t.match([...bearers][0], /^Bearer tok-\d+$/)
})

t.test('oauth2: a 401 from the consumer fails that attempt and fetches a token again, once', async (t) => {
  await group('oa401', { maxDeliveries: 3, retry: { initialDelayMs: 10, maxDelayMs: 10, multiplier: 1, jitter: 0 } })
  let refused: string | undefined
  const receiver = await startReceiver(t, (req) => {
    if (refused === undefined) refused = req.headers.authorization
    return req.headers.authorization === refused ? { status: 401 } : { status: 200 }
  })
  const before = tokenRequests.length
  t.equal(
    (
      await call('POST', '/v1/groups/oa401/consumers', {
        url: receiver.url,
        auth: { type: 'oauth2', tokenUrl: `${tokenBase}/token`, clientId: 'c', clientSecret: SECRETS[2] },
      })
    ).status,
    201,
  )
  await produce('oa401', [{ value: 1 }])
  await waitUntil(async () => (await deliveries('oa401')).some((d) => d.outcome === 'acked'), 10_000, 'the retry acked')
  const log = await deliveries('oa401')
  t.same(
    log.map((d) => [d.outcome, d.statusCode]).reverse(),
    [
      ['failed', 401],
      ['acked', 200],
    ],
    'the 401 attempt failed, the next one went through with a new token',
  )
  t.equal(tokenRequests.length - before, 2, 'two token requests: the first, and one after the 401')
})

t.test('oauth2: a short expires_in is refetched once it runs out', async (t) => {
  await group('oashort')
  const receiver = await startReceiver(t)
  await call('POST', '/v1/groups/oashort/consumers', {
    url: receiver.url,
    auth: { type: 'oauth2', tokenUrl: `${tokenBase}/short`, clientId: 'c', clientSecret: SECRETS[2] },
  })
  await produce('oashort', [{ value: 1 }])
  const [a] = await receiver.waitFor(1)
  const fetchedAt = Date.now()
  await waitUntil(() => Date.now() - fetchedAt > 1100, 5000, 'the token of 1 s to run out')
  await produce('oashort', [{ value: 2 }])
  const got = await receiver.waitFor(2)
  t.match(a!.headers.authorization, /^Bearer short-\d+$/)
  t.not(got[1]!.headers.authorization, a!.headers.authorization, 'a new token after expires_in')
})

t.test('oauth2: token endpoint slow, down, garbled: the push is not sent and the attempt log says why', async (t) => {
  const closed = http.createServer()
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const deadPort = (closed.address() as net.AddressInfo).port
  await new Promise((resolve) => closed.close(resolve))
  const cases = [
    { name: 'oaslow', tokenUrl: `${tokenBase}/slow`, error: /did not answer within 2000 ms/ },
    { name: 'oadown', tokenUrl: `http://127.0.0.1:${deadPort}/token`, error: /unreachable: .*ECONNREFUSED/ },
    { name: 'oagarbage', tokenUrl: `${tokenBase}/garbage`, error: /without JSON/ },
    { name: 'oanotoken', tokenUrl: `${tokenBase}/no-token`, error: /without a usable access_token/ },
    { name: 'oa404', tokenUrl: `${tokenBase}/missing`, error: /answered HTTP 404/ },
    { name: 'oaform', tokenUrl: `${tokenBase}/form`, error: /without JSON/ },
    { name: 'oamac', tokenUrl: `${tokenBase}/mac`, error: /issued a mac token; only bearer tokens are supported/ },
    { name: 'oacut', tokenUrl: `${tokenBase}/token-no-json-type`, error: /without JSON/ },
  ]
  const receiver = await startReceiver(t)
  for (const c of cases) {
    await group(c.name)
    await call('POST', `/v1/groups/${c.name}/consumers`, {
      url: `${receiver.url}/${c.name}`,
      auth: { type: 'oauth2', tokenUrl: c.tokenUrl, clientId: 'c', clientSecret: SECRETS[2] },
    })
    await produce(c.name, [{ value: 1 }])
  }
  for (const c of cases) {
    const [d] = await waitUntil(async () => {
      const log = await deliveries(c.name)
      return log.length > 0 && log[0]!.outcome !== 'in_flight' ? log : undefined
    }, 10_000)
    t.match(d!.error, c.error, `${c.name}: ${d!.error}`)
    t.match(d!.error, /OAuth token endpoint/)
    t.notOk(d!.error!.includes(SECRETS[2]!), 'the client secret is not in the error')
    t.notOk(d!.error!.includes(LEAKY_TOKEN), "a 2xx answer's text (a token in it) is not in the error")
  }
  const stored = await sql("SELECT count(*)::int AS n FROM deliveries WHERE error LIKE '%' || $1 || '%'", [LEAKY_TOKEN])
  t.equal(stored[0].n, 0, 'nor anywhere in deliveries.error')
  t.equal(receiver.requests.length, 0, 'no push went out without its token')
})

t.test('oauth2: the token URL is under the push URL policy', async (t) => {
  await group('oapolicy')
  const res = await call('POST', '/v1/groups/oapolicy/consumers', {
    url: 'http://127.0.0.1:9/x',
    auth: { type: 'oauth2', tokenUrl: 'http://169.254.169.254/token', clientId: 'c', clientSecret: 's' },
  })
  t.equal(res.status, 400)
  t.match(res.json, { code: 'url_not_allowed', detail: /auth\.tokenUrl/ })
})

t.test('no secret value in any text column of the database, nor in a log line', async (t) => {
  const columns = await sql(
    `SELECT table_name, column_name FROM information_schema.columns
      WHERE table_schema = 'public' AND data_type IN ('text', 'character varying', 'jsonb', 'json')`,
  )
  let scanned = 0
  for (const { table_name, column_name } of columns) {
    const rows = await sql(`SELECT "${column_name}"::text AS v FROM "${table_name}" WHERE "${column_name}" IS NOT NULL`)
    for (const { v } of rows) {
      scanned++
      for (const s of SECRETS) t.notOk(String(v).includes(s), `${table_name}.${column_name} holds no secret value`)
    }
  }
  t.ok(scanned > 0)
  const keys = await sql('SELECT private_jwk FROM jwt_keys')
  t.ok(keys.length >= 2)
  for (const k of keys) t.match(k.private_jwk, /^hqenc:2:/, 'JWT private keys are sealed')
  const sealed = await sql('SELECT secret, auth_secret FROM consumers WHERE secret IS NOT NULL OR auth_secret IS NOT NULL')
  for (const r of sealed) {
    if (r.secret) t.match(r.secret, /^hqenc:2:/)
    if (r.auth_secret) t.match(r.auth_secret, /^hqenc:2:/)
  }
  t.ok(logLines.length > 0, 'the broker logged')
  for (const line of logLines) for (const s of SECRETS) t.notOk(line.includes(s), 'no secret value in a log line')
})

// pg_dump is a second session beside the broker's, and execFileSync blocks this process, which
// serves the embedded database: there it would wait for ever.
t.test('no secret value in a pg_dump of the database', { skip: needsServer }, async (t) => {
  const dump = execFileSync('pg_dump', ['--data-only', '--no-owner', db.url], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 })
  t.match(dump, /hqenc:2:/, 'the dump holds sealed values')
  for (const s of SECRETS) t.notOk(dump.includes(s), 'no secret value in a pg_dump of the database')
})

t.test('the CLI shows the auth type and header names, never a value', async (t) => {
  const list = await runCli(['consumers', 'list', 'hdr'], { url: brokerUrl })
  t.equal(list.code, 0, list.stderr)
  t.match(list.stdout, /headers x-api-key, authorization/)
  const add = await runCli(['consumers', 'add', 'oa', 'http://127.0.0.1:9/cli', '--auth-file', '-'], {
    url: brokerUrl,
    stdin: JSON.stringify({ type: 'oauth2', tokenUrl: `${tokenBase}/token`, clientId: 'cli-client', clientSecret: SECRETS[2] }),
  })
  t.equal(add.code, 0, add.stderr)
  t.match(add.stdout, /auth: oauth2 cli-client @ /)
  const json = await runCli(['--json', 'consumers', 'list', 'oa'], { url: brokerUrl })
  for (const out of [list, add, json])
    for (const s of SECRETS) t.notOk(out.stdout.includes(s) || out.stderr.includes(s), 'no secret value printed')
})

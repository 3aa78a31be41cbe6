/**
 * Secrets at rest (HOOKQ_SECRETS_KEY): the envelope (AES-256-GCM bound to its row), and one database
 * through a key's life: secrets written in the clear before a key existed are sealed when a broker
 * starts with one, and still sign and authenticate pushes; a broker without the key refuses to
 * start, saying which key it needs (in-process and as a real process); a second key with the first
 * as HOOKQ_SECRETS_KEY_PREVIOUS re-seals everything; `hookq secrets rotate` does it online, counts
 * what remains and fails while anything does; values sealed before the AAD named their endpoint
 * (envelope version 1) are re-sealed without loss; auth values pointed at another endpoint in the
 * database no longer open; a broker with only the old key says so.
 */
import { createCipheriv, randomBytes } from 'node:crypto'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { signWebhook } from '../../src/core/signature.ts'
import { keyId, SecretBox, SecretsKeyError, sealedKid } from '../../src/security/secrets.ts'
import { authPlace } from '../../src/service/consumer-auth.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { runBrokerToExit } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { runCli } from '../cli/run.ts'
import { waitUntil } from '../helpers/wait.ts'

const K1 = Buffer.alloc(32, 1)
const K2 = Buffer.alloc(32, 2)
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
const HEADER_VALUE = 'hv-8c1d0e6f2a'
const place = { table: 'consumers', field: 'secret', rowId: 'a' }

/** A value as the broker sealed it before version 2 (AAD `hookq:<table>.<field>:<row id>`, no endpoint). */
function sealV1(key: Buffer, clear: string, p: { table: string; field: string; rowId: string }): string {
  const nonce = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, nonce)
  cipher.setAAD(Buffer.from(`hookq:${p.table}.${p.field}:${p.rowId}`))
  const body = Buffer.concat([cipher.update(clear, 'utf8'), cipher.final(), cipher.getAuthTag()])
  return `hqenc:1:${keyId(key)}:${nonce.toString('base64url')}:${body.toString('base64url')}`
}

t.test('the envelope: round trip, bound to its row, tamper-evident, names a missing key', async (t) => {
  const box = new SecretBox(K1)
  const sealed = box.seal('hello', place)
  t.match(sealed, new RegExp(`^hqenc:2:${keyId(K1)}:`))
  t.not(box.seal('hello', place), sealed, 'a fresh nonce per seal')
  t.equal(box.open(sealed, place), 'hello')
  t.throws(() => box.open(sealed, { ...place, rowId: 'b' }), SecretsKeyError, 'another row cannot open it')
  t.throws(() => box.open(sealed, { ...place, field: 'auth_secret' }), SecretsKeyError, 'another field cannot open it')
  const headers = authPlace('a', 'https://a.example/hook', JSON.stringify({ type: 'headers', names: ['x-key'] }))
  const bound = box.seal('v', headers)
  t.equal(box.open(bound, headers), 'v')
  t.throws(
    () => box.open(bound, authPlace('a', 'https://evil.example/hook', JSON.stringify({ type: 'headers', names: ['x-key'] }))),
    /endpoint changed/,
    'header values are bound to the push URL',
  )
  const oauth = { type: 'oauth2', tokenUrl: 'https://auth.example/token', clientId: 'c' }
  const client = box.seal('s', authPlace('a', 'https://a.example/hook', JSON.stringify(oauth)))
  t.equal(box.open(client, authPlace('a', 'https://a.example/hook', JSON.stringify(oauth))), 's')
  t.throws(
    () => box.open(client, authPlace('a', 'https://b.example/other', JSON.stringify(oauth))),
    SecretsKeyError,
    'a client secret is bound to the push URL too (the token it gets is sent there)',
  )
  for (const moved of [
    { ...oauth, tokenUrl: 'https://evil.example/token' },
    { ...oauth, clientId: 'other' },
  ]) {
    t.throws(
      () => box.open(client, authPlace('a', 'https://a.example/hook', JSON.stringify(moved))),
      SecretsKeyError,
      `a client secret is bound to its token endpoint: ${JSON.stringify(moved)}`,
    )
  }
  const old = sealV1(K1, 'from before', place)
  t.equal(box.open(old, place), 'from before', 'a version 1 value still opens')
  t.ok(box.needsReseal(old), 'and is due to be sealed again')
  t.throws(() => box.open(old, { ...place, rowId: 'b' }), SecretsKeyError, 'bound to its row as before')
  const parts = sealed.split(':')
  const body = Buffer.from(parts[4]!, 'base64url')
  body[0]! ^= 1
  parts[4] = body.toString('base64url')
  t.throws(() => box.open(parts.join(':'), place), SecretsKeyError, 'an altered ciphertext does not open')
  t.throws(() => new SecretBox(K2).open(sealed, place), new RegExp(`key ${keyId(K1)}, which is not configured`))
  t.throws(() => new SecretBox().open(sealed, place), /HOOKQ_SECRETS_KEY is not set/)
  t.equal(new SecretBox(K2, [K1]).open(sealed, place), 'hello', 'a previous key opens')
  t.ok(new SecretBox(K2, [K1]).needsReseal(sealed))
  t.notOk(box.needsReseal(sealed))
  t.equal(new SecretBox().seal('x', place), 'x', 'without a key: clear')
  t.equal(box.open('whsec_clear', place), 'whsec_clear', 'a clear value reads as it is')
  t.throws(() => loadConfig({ HOOKQ_SECRETS_KEY: 'dG9vIHNob3J0' }), /HOOKQ_SECRETS_KEY must be the base64 of 32 random bytes/)
})

const db = await testDatabase(t)
const env = (keys: Record<string, string>) =>
  loadConfig({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 4)), LOG_LEVEL: 'silent', ...keys })
const b64 = (k: Buffer) => k.toString('base64')
const receiver = await startReceiver(t)

async function withBroker<T>(keys: Record<string, string>, fn: (b: Broker) => Promise<T>): Promise<T> {
  const broker = await createBroker(env(keys))
  try {
    return await fn(broker)
  } finally {
    await broker.close()
  }
}

/** Every stored secret value: the consumer's two, and the JWT private keys. */
async function stored(b: Broker): Promise<string[]> {
  const consumers = await api(b).sql('SELECT secret, auth_secret FROM consumers')
  const keys = await api(b).sql('SELECT private_jwk FROM jwt_keys')
  return [...consumers.flatMap((r) => [r.secret, r.auth_secret]), ...keys.map((r) => r.private_jwk)]
}

/** Produces one message and checks its push carries the header and a signature made with SECRET. */
async function pushesAuthenticated(t: Test, b: Broker, n: number): Promise<void> {
  await api(b).produce('s', [{ value: n }])
  const r = (await receiver.waitFor(n))[n - 1]!
  t.equal(r.headers['x-key'], HEADER_VALUE, 'the auth header, opened')
  const id = String(r.headers['webhook-id'])
  const ts = Number(r.headers['webhook-timestamp'])
  t.equal(r.headers['webhook-signature'], signWebhook({ id, timestampS: ts, body: r.body, secrets: [SECRET] }), 'signed with the secret')
}

// `hookq secrets rotate` runs online, a process of its own beside the broker on the same database:
// the embedded database serves one connection at a time.
t.test('a database through a key life', { skip: needsServer }, async (t) => {
  await withBroker({}, async (b) => {
    const { call } = api(b)
    await call('PUT', '/v1/topics/s', { partitions: 1 })
    await call('PUT', '/v1/groups/s', { topic: 's', ackMode: 'auto' })
    const res = await call('POST', '/v1/groups/s/consumers', {
      url: receiver.url,
      secret: SECRET,
      auth: { type: 'headers', headers: { 'x-key': HEADER_VALUE } },
    })
    t.equal(res.status, 201)
    const values = await stored(b)
    t.ok(values.includes(SECRET), 'without a key: the v1 secret in the clear (as before)')
    t.ok(
      values.every((v) => v === null || sealedKid(v) === null),
      'nothing sealed',
    )
    await pushesAuthenticated(t, b, 1)
  })

  await withBroker({ HOOKQ_SECRETS_KEY: b64(K1) }, async (b) => {
    // Start-up re-seals nothing (a process not restarted yet could not open what it sealed): the
    // values stay as they are until `hookq secrets rotate`, and the broker goes on pushing with them.
    const before = (await stored(b)).filter((v) => v !== null)
    t.ok(before.length >= 3)
    t.ok(before.includes(SECRET), 'start-up left the clear values as they were')
    await pushesAuthenticated(t, b, 2)
    const cli = await runCli(['secrets', 'rotate'], { env: { DATABASE_URL: db.url, HOOKQ_SECRETS_KEY: b64(K1) } })
    t.equal(cli.code, 0, cli.stderr)
    const values = (await stored(b)).filter((v) => v !== null)
    t.ok(
      values.every((v) => sealedKid(v) === keyId(K1)),
      'sealed with the key by `hookq secrets rotate`',
    )
    t.notOk(values.join().includes(SECRET) || values.join().includes(HEADER_VALUE), 'no clear value left')
  })

  for (const keys of [{}, { HOOKQ_SECRETS_KEY: b64(K2) }] as Record<string, string>[]) {
    await t.rejects(
      createBroker(env(keys)),
      new RegExp(`stored secrets cannot be opened \\(\\d+ sealed with key ${keyId(K1)}\\)`),
      'a broker without the key refuses to start',
    )
  }
  const run = await runBrokerToExit({ DATABASE_URL: db.url, PORT: '0', LOG_LEVEL: 'silent' })
  t.equal(run.code, 1, 'the real process exits 1')
  t.match(run.output, /hookq: cannot start: stored secrets cannot be opened .*HOOKQ_SECRETS_KEY/)
  t.notOk(run.output.includes(SECRET))

  await withBroker({ HOOKQ_SECRETS_KEY: b64(K2), HOOKQ_SECRETS_KEY_PREVIOUS: b64(K1) }, async (b) => {
    t.ok(
      (await stored(b)).every((v) => v === null || sealedKid(v) === keyId(K1)),
      'a new key with the old one as previous: start-up leaves the values under the old one',
    )
    await pushesAuthenticated(t, b, 3)
    const rotateEnv = { DATABASE_URL: db.url, HOOKQ_SECRETS_KEY: b64(K2), HOOKQ_SECRETS_KEY_PREVIOUS: b64(K1) }
    const rotated = await runCli(['secrets', 'rotate'], { env: rotateEnv })
    t.equal(rotated.code, 0, rotated.stderr)
    t.ok(
      (await stored(b)).every((v) => v === null || sealedKid(v) === keyId(K2)),
      '`hookq secrets rotate`: everything sealed with the new one',
    )
    // Values sealed with K1 in the version 1 envelope, as a process of an older hookq wrote them:
    // the CLI re-seals them online, counts again, and a second run finds nothing to do.
    const { id: cid } = (await api(b).sql('SELECT id FROM consumers'))[0]
    await api(b).sql('UPDATE consumers SET auth_secret = $1, secret = $2', [
      sealV1(K1, JSON.stringify({ 'x-key': HEADER_VALUE }), { table: 'consumers', field: 'auth_secret', rowId: cid }),
      sealV1(K1, SECRET, { table: 'consumers', field: 'secret', rowId: cid }),
    ])
    const cli = await runCli(['secrets', 'rotate'], { env: rotateEnv })
    t.equal(cli.code, 0, cli.stderr)
    t.match(cli.stdout, new RegExp(`sealed 2 stored secret value\\(s\\) with key ${keyId(K2)}; 0 remain`))
    t.notOk(cli.stdout.includes(b64(K2)) || cli.stdout.includes(HEADER_VALUE), 'no key and no value printed')
    t.ok((await stored(b)).every((v) => v === null || (sealedKid(v) === keyId(K2) && v.startsWith('hqenc:2:'))))
    const again = await runCli(['--json', 'secrets', 'rotate'], { env: rotateEnv })
    t.equal(again.code, 0, again.stderr)
    t.match(JSON.parse(again.stdout), { sealed: 0, remaining: 0 }, 'idempotent: a second run seals nothing')
    t.equal((await api(b).call('PATCH', `/v1/groups/s/consumers/${cid}`, { maxConcurrency: 4 })).status, 200, 'reloaded')
    await pushesAuthenticated(t, b, 4)

    // A value sealed with a key the CLI was not given: counted, named, and the command fails.
    const K4 = Buffer.alloc(32, 4)
    const { private_jwk: jwk, kid: jwtKid } = (await api(b).sql('SELECT kid, private_jwk FROM jwt_keys LIMIT 1'))[0]
    await api(b).sql('UPDATE jwt_keys SET private_jwk = $1 WHERE kid = $2', [
      new SecretBox(K4).seal('{}', { table: 'jwt_keys', field: 'private_jwk', rowId: jwtKid }),
      jwtKid,
    ])
    const short = await runCli(['--json', 'secrets', 'rotate'], { env: rotateEnv })
    t.equal(short.code, 1, 'fails while a value remains')
    t.match(JSON.parse(short.stdout), { remaining: 1, unreadable: { [keyId(K4)]: 1 } })
    t.match(short.stderr, new RegExp(`1 stored secret value\\(s\\) are not sealed with key ${keyId(K2)}: 1 sealed with key ${keyId(K4)}`))
    await api(b).sql('UPDATE jwt_keys SET private_jwk = $1 WHERE kid = $2', [jwk, jwtKid])

    const cliEnv = { DATABASE_URL: db.url, HOOKQ_SECRETS_KEY: b64(K2) }
    const tooShort = await runCli(['jwks', 'rotate', '--propagation-ms', '1000'], { env: cliEnv })
    t.equal(tooShort.code, 2, 'a propagation delay within the refresh interval is refused')
    t.match(tooShort.stderr, /must exceed HOOKQ_JWT_KEYS_REFRESH_MS/)
    const jwks = await runCli(['--json', 'jwks', 'rotate', '--propagation-ms', '120000'], { env: cliEnv })
    t.equal(jwks.code, 0, jwks.stderr)
    const { kid } = JSON.parse(jwks.stdout) as { kid: string }
    const keys = await api(b).sql('SELECT kid, private_jwk, expires_at FROM jwt_keys ORDER BY created_at')
    t.equal(keys.at(-1).kid, kid, 'the new key is stored')
    t.equal(sealedKid(keys.at(-1).private_jwk), keyId(K2), 'its private key sealed')
    t.ok(
      keys.slice(0, -1).every((k) => k.expires_at !== null),
      'the keys it replaces have an end',
    )
    const listed = (await api(b).call('GET', '/.well-known/jwks.json')).json.keys.map((k: { kid: string }) => k.kid)
    t.ok(listed.includes(kid), 'and it is listed at once')
  })

  await t.rejects(
    createBroker(env({ HOOKQ_SECRETS_KEY: b64(K1) })),
    new RegExp(`HOOKQ_SECRETS_KEY is key ${keyId(K1)}, which seals none of the stored values: this process has only an old key`),
    'a broker with only the old key says so at start-up',
  )

  await withBroker({ HOOKQ_SECRETS_KEY: b64(K2) }, async (b) => {
    await pushesAuthenticated(t, b, 5)
    // A value sealed by a process with a key this one lacks, seen at run time: not pushed, and why.
    const K3 = Buffer.alloc(32, 3)
    const { id } = (await api(b).sql('SELECT id FROM consumers'))[0]
    await api(b).sql('UPDATE consumers SET auth_secret = $1', [
      new SecretBox(K3).seal('{}', { table: 'consumers', field: 'auth_secret', rowId: id }),
    ])
    t.equal((await api(b).call('PATCH', `/v1/groups/s/consumers/${id}`, { maxConcurrency: 5 })).status, 200, 'reloaded')
    await api(b).produce('s', [{ value: 6 }])
    const [d] = await waitUntil(async () => {
      const log = (await api(b).call('GET', '/v1/groups/s/deliveries?limit=1')).json.deliveries
      return log[0]?.error ? log : undefined
    })
    t.match(
      d.error,
      new RegExp(`not pushed: consumers.auth_secret of ${id} is sealed with secrets key ${keyId(K3)}, which is not configured`),
    )
    t.notOk(
      receiver.requests.some((r) => (r.json as { value: unknown }).value === 6),
      `nothing pushed with secrets it could not open (${receiver.requests.map((r) => (r.json as { value: unknown }).value)})`,
    )

    // Header values are sealed for the URL they go to: a new URL through the API seals them anew
    // (pushes go on), one written in the database by someone without the key leaves them sealed.
    const { call } = api(b)
    await call('PUT', '/v1/topics/m', { partitions: 1 })
    await call('PUT', '/v1/groups/m', { topic: 'm', ackMode: 'auto' })
    const m = (
      await call('POST', '/v1/groups/m/consumers', {
        url: `${receiver.url}/m`,
        auth: { type: 'headers', headers: { 'x-key': HEADER_VALUE } },
      })
    ).json
    t.equal((await call('PATCH', `/v1/groups/m/consumers/${m.id}`, { url: `${receiver.url}/m-moved` })).status, 200)
    await api(b).produce('m', [{ value: 'via-api' }])
    const moved = await waitUntil(() => receiver.requests.find((r) => (r.json as { value: unknown }).value === 'via-api'))
    t.equal(moved.path, '/m-moved')
    t.equal(moved.headers['x-key'], HEADER_VALUE, 'a URL changed through the API: the header still opens')
    await api(b).sql('UPDATE consumers SET url = $1 WHERE id = $2', [`${receiver.url}/attacker`, m.id])
    t.equal((await call('PATCH', `/v1/groups/m/consumers/${m.id}`, { maxConcurrency: 5 })).status, 200, 'reloaded')
    await api(b).produce('m', [{ value: 'via-sql' }])
    const [e] = await waitUntil(async () => {
      const log = (await call('GET', '/v1/groups/m/deliveries?limit=1')).json.deliveries
      return log[0]?.error ? log : undefined
    })
    t.match(e.error, /does not authenticate .*endpoint changed in the database/, 'a URL changed in the database: the header does not open')
    t.notOk(
      receiver.requests.some((r) => r.path === '/attacker' && r.headers['x-key'] !== undefined),
      'the header value never went to the URL written in the database',
    )
  })
})

/**
 * A stored API key's rights are checked against what is true now, not what a request or a cache saw
 * earlier (issue 32 review): a long poll that outlives its key's deletion or expiry answers 401 and
 * leases nothing to it, and a group deleted and made again on another topic is checked against its
 * new topic at once. Two broker processes (in-process, one database): one deletes or remakes, the
 * other answers.
 */
import pino from 'pino'
import t from '../helpers/tap.ts'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

// Two broker processes share the database: the embedded one serves a single connection at a time.
if (needsServer) t.plan(0, needsServer)
else await freshness()

async function freshness() {
  const ROOT = 'root-key-of-the-key-freshness-test'
  const db = await testDatabase(t)
  const start = async () => {
    const broker = await createBroker(
      loadConfig({
        DATABASE_URL: db.url,
        HOOKQ_DB_POOL_SIZE: String(Math.max(2, Math.min(Math.floor(db.maxConnections / 2), 6))),
        HOOKQ_API_KEYS: ROOT,
      }),
      { logger: pino({ level: 'silent' }) },
    )
    t.teardown(() => broker.close())
    // Listening and advertised: either process may own the group's partition, and the other forwards to it.
    const url = await broker.app.listen({ host: '127.0.0.1', port: 0 })
    await broker.advertise(url)
    return { broker, url }
  }
  const { broker: here, url } = await start()
  const { broker: there } = await start()

  interface Answer {
    status: number
    json: any
  }
  const call = async (key: string, method: string, path: string, body?: object): Promise<Answer> => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
    })
    const text = await res.text()
    return { status: res.status, json: text ? JSON.parse(text) : undefined }
  }
  const root = (method: string, path: string, body?: object) => call(ROOT, method, path, body)
  const makeKey = async (name: string, scopes: object[], expiresAt?: string) => {
    const res = await root('POST', '/v1/keys', { name, scopes, ...(expiresAt ? { expiresAt } : {}) })
    if (res.status !== 201) throw new Error(`POST /v1/keys: ${res.status} ${JSON.stringify(res.json)}`)
    return res.json as { id: string; key: string }
  }
  /**
   * Waits until the pull waits for the group (the call passed its key check): on this process when
   * it owns the group's partition, else as this process's probe on the other one, which does.
   */
  const waiting = (group: string) =>
    waitUntil(() => here.cluster.pullWaiters(group) + there.cluster.pullWaiters(group) > 0, 30_000, `a pull waiting on ${group}`)

  for (const topic of ['jobs', 'quiet', 'orders', 'billing']) await root('PUT', `/v1/topics/${topic}`, { partitions: 1 })

  t.test('a waiting pull whose key is deleted (by another process) answers 401 and leases nothing to it', async (t) => {
    await root('PUT', '/v1/groups/takers', { topic: 'jobs', delivery: 'pull' })
    const { id, key } = await makeKey('taker', [{ action: 'consume', groups: ['takers'] }])
    const pulling = call(key, 'POST', '/v1/groups/takers/pull', { waitMs: 20_000, leaseMs: 1000 })
    await waiting('takers')

    const deleted = await there.app.inject({ method: 'DELETE', url: `/v1/keys/${id}`, headers: { authorization: `Bearer ${ROOT}` } })
    t.equal(deleted.statusCode, 204)
    await waitUntil(async () => (await call(key, 'GET', '/v1/groups/takers')).status === 401, 30_000, 'this process to refuse the key')
    // A message now would be leased to the waiting pull, were its key not checked again.
    t.equal((await root('POST', '/v1/topics/jobs/messages', { messages: [{ value: { job: 1 } }] })).status, 201)

    const answer = await pulling
    t.equal(answer.status, 401, 'the waiting pull is refused')
    t.match(answer.json, { code: 'unauthorized' })
    t.notOk(JSON.stringify(answer.json).includes(key), 'the answer does not quote the key')
    const got = await waitUntil(
      async () => {
        const res = await root('POST', '/v1/groups/takers/pull', { waitMs: 1000 })
        return res.status === 200 && res.json.messages.length > 0 ? res.json.messages : undefined
      },
      30_000,
      'the message to be pulled with a valid key',
    )
    t.same(
      got.map((m: { value: unknown }) => m.value),
      [{ job: 1 }],
      'the message went to a valid key (at once, or when a lease made for nobody expired)',
    )
  })

  t.test('a waiting pull whose key expires meanwhile answers 401, not 200 at the end of its wait', async (t) => {
    await root('PUT', '/v1/groups/expiring', { topic: 'quiet', delivery: 'pull' })
    const { key } = await makeKey('short-lived', [{ action: 'consume', groups: ['expiring'] }], new Date(Date.now() + 4000).toISOString())
    const pulling = call(key, 'POST', '/v1/groups/expiring/pull', { waitMs: 20_000 })
    await waiting('expiring')
    const answer = await pulling
    t.equal(answer.status, 401)
    t.match(answer.json, { code: 'unauthorized', detail: /expired/ })
  })

  t.test('a group deleted and made again on another topic is checked against its new topic at once', async (t) => {
    await root('PUT', '/v1/groups/moving', { topic: 'orders', delivery: 'pull' })
    const { key } = await makeKey('orders-reader', [{ action: 'consume', topics: ['orders'] }])
    t.equal((await call(key, 'GET', '/v1/groups/moving')).status, 200, 'a group on its topic')
    t.equal((await call(key, 'POST', '/v1/groups/moving/pull', {})).status, 200)

    // Another process deletes the group and makes it again on a topic the key may not read.
    const rootThere = { authorization: `Bearer ${ROOT}` }
    t.equal((await there.app.inject({ method: 'DELETE', url: '/v1/groups/moving', headers: rootThere })).statusCode, 204)
    const made = await there.app.inject({
      method: 'PUT',
      url: '/v1/groups/moving',
      headers: rootThere,
      payload: { topic: 'billing', delivery: 'pull' },
    })
    t.equal(made.statusCode, 201)

    t.equal((await call(key, 'GET', '/v1/groups/moving')).status, 403, 'the group on billing is not readable')
    t.equal((await call(key, 'POST', '/v1/groups/moving/pull', {})).status, 403, 'nor pulled')
    t.equal((await call(key, 'GET', '/v1/groups/moving/deliveries')).status, 403, 'nor its attempt log')
  })
}

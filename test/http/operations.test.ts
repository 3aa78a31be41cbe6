import { readFile } from 'node:fs/promises'
import t from '../helpers/tap.ts'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { startBroker } from '../helpers/broker.ts'
import { testDatabase } from '../helpers/db.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('health, readiness, OpenAPI and docs', async (t) => {
  const { app } = await startBroker(t)
  t.same((await app.inject({ url: '/healthz' })).json(), { status: 'ok' })
  const ready = await app.inject({ url: '/readyz' })
  t.equal(ready.statusCode, 200)
  t.same(ready.json(), { status: 'ok', checks: { database: 'ok', migrations: 'ok' } })

  const served = (await app.inject({ url: '/openapi.json' })).json()
  const committed = JSON.parse(await readFile(new URL('../../openapi/openapi.json', import.meta.url), 'utf8'))
  t.same(served, committed, 'the committed document is what the broker serves')
  for (const [path, ops] of Object.entries<Record<string, { operationId?: string; tags?: string[]; responses: object }>>(served.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      t.ok(op.operationId, `${method} ${path} has an operationId`)
      t.ok(op.tags?.length, `${method} ${path} has tags`)
    }
  }
  const docs = await app.inject({ url: '/docs/' })
  t.equal(docs.statusCode, 200)
  t.match(docs.body, /swagger/i)
})

t.test('database outage: 503 with Retry-After meanwhile, recovery without a restart', async (t) => {
  const db = await testDatabase(t)
  const target = new URL(db.url)
  const proxy = await startTcpProxy(target.hostname, Number(target.port || 5432))
  t.teardown(() => proxy.close())
  const viaProxy = new URL(db.url)
  viaProxy.host = `127.0.0.1:${proxy.port}`
  const broker = await createBroker(
    loadConfig({
      DATABASE_URL: viaProxy.href,
      HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 4)),
      LOG_LEVEL: 'silent',
    }),
  )
  t.teardown(() => broker.close())
  const { app } = broker
  t.equal((await app.inject({ method: 'PUT', url: '/v1/topics/outage', payload: { partitions: 1 } })).statusCode, 201)
  const produce = (value: string) => app.inject({ method: 'POST', url: '/v1/topics/outage/messages', payload: { messages: [{ value }] } })
  t.equal((await produce('before')).statusCode, 201)

  await proxy.cut()
  // The first call after the cut races the pool: a pooled connection the cut has just reset may
  // take the statement before the pool notices, and then the broker cannot know whether it
  // committed and says so (500 outcome_unknown, without Retry-After: a blind retry could store
  // the messages twice). Once the pool knows, the answer is 503 with Retry-After. Which of the
  // two comes first is the race's, not the test's; each must be answered in full, and never a 2xx.
  const during = await produce('during')
  if (during.statusCode === 500) {
    t.equal(during.json().code, 'outcome_unknown', 'in doubt: the broker says it cannot know')
    t.equal(during.headers['retry-after'], undefined, 'and does not invite a retry')
  } else {
    t.equal(during.statusCode, 503, 'produce is refused while the database is away')
    t.equal(during.json().code, 'unavailable')
    t.equal(during.headers['retry-after'], '1')
  }
  t.comment(`the first call after the cut was answered ${during.statusCode}`)
  const again = await produce('during-2')
  t.equal(again.statusCode, 503, 'with no connection left, produce answers 503')
  t.equal(again.headers['retry-after'], '1')
  t.equal(again.json().code, 'unavailable')
  const ready = await app.inject({ url: '/readyz' })
  t.equal(ready.statusCode, 503)
  t.match(ready.json(), { status: 'unavailable', checks: { database: /unreachable/ } })
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200, 'still alive')

  await proxy.heal()
  const after = await waitUntil(
    async () => {
      const r = await produce('after')
      return r.statusCode === 201 ? r : undefined
    },
    20_000,
    'produce to recover',
  )
  t.same(after.json().results, [{ partition: 0, offset: 1 }], 'offsets stay dense')
  t.equal((await app.inject({ url: '/readyz' })).statusCode, 200)
  // What the database holds: the cut reset every connection before the two calls of the outage
  // and the proxy forwarded nothing until it healed, so neither reached PostgreSQL, whatever the
  // broker could tell its caller.
  const { rows } = await broker.db.pool.query(`SELECT m."offset"::int AS "offset", m.value FROM messages m
    JOIN topics tp ON tp.id = m.topic_id WHERE tp.name = 'outage' ORDER BY m."offset"`)
  t.same(
    rows,
    [
      { offset: 0, value: '"before"' },
      { offset: 1, value: '"after"' },
    ],
    'stored: the messages produced before the cut and after the recovery, nothing of the outage',
  )
})

t.test('API keys: /v1 needs a bearer key, health stays open', async (t) => {
  const { app } = await startBroker(t, { HOOKQ_API_KEYS: 'k-one,k-two' })
  const anon = await app.inject({ url: '/v1/topics' })
  t.equal(anon.statusCode, 401)
  t.equal(anon.json().code, 'unauthorized')
  t.equal((await app.inject({ url: '/v1/topics', headers: { authorization: 'Bearer wrong' } })).statusCode, 401)
  t.equal((await app.inject({ url: '/v1/topics', headers: { authorization: 'Basic k-one' } })).statusCode, 401)
  t.equal((await app.inject({ url: '/v1/topics', headers: { authorization: 'Bearer k-two' } })).statusCode, 200)
  const put = await app.inject({ method: 'PUT', url: '/v1/topics/secret', payload: { partitions: 1 } })
  t.equal(put.statusCode, 401, 'a rejected call writes nothing')
  t.equal((await app.inject({ url: '/v1/topics/secret', headers: { authorization: 'Bearer k-one' } })).statusCode, 404)
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200)
  t.equal((await app.inject({ url: '/readyz' })).statusCode, 200)
})

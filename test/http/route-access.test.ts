/**
 * Every route checks its key: the test walks Fastify's route table (as installAuth recorded it), so
 * a route added tomorrow is called here too. Each /v1 route (and /metrics) is called with a key of
 * the wrong action and with a key of the right action whose patterns do not match: 403 (a list
 * route answers an empty list instead), never the route's work. A /v1 route without an access rule
 * does not even register.
 */
import Fastify from 'fastify'
import t from '../helpers/tap.ts'
import { installAuth, routeTable } from '../../src/http/auth.ts'
import type { RouteAccess } from '../../src/http/scopes.ts'
import type { KeyScope } from '../../src/security/access.ts'
import { startBroker } from '../helpers/broker.ts'

const ROOT = 'root-key-for-the-walk'

t.test('every /v1 route refuses a key of the wrong scope and of a pattern that does not match', async (t) => {
  const broker = await startBroker(t, { HOOKQ_API_KEYS: ROOT })
  const app = broker.app
  const as = (key: string) => ({ authorization: `Bearer ${key}` })
  const root = async (method: string, url: string, payload?: object) => {
    const res = await app.inject({ method: method as 'GET', url, headers: as(ROOT), ...(payload ? { payload } : {}) })
    if (res.statusCode >= 300) t.fail(`${method} ${url}: ${res.statusCode} ${res.body}`)
    return res.statusCode === 204 ? undefined : res.json()
  }
  await root('PUT', '/v1/topics/orders', { partitions: 1 })
  await root('PUT', '/v1/groups/orders-g', { topic: 'orders' })
  const consumer = await root('POST', '/v1/groups/orders-g/consumers', { url: 'http://127.0.0.1:9/hook' })
  await root('PUT', '/v1/schedules/orders-s', { topic: 'orders', every: 3_600_000, message: { value: 1 } })
  const makeKey = async (name: string, scopes: KeyScope[]) => (await root('POST', '/v1/keys', { name, scopes })).key as string
  const keyToDelete = (await root('POST', '/v1/keys', { name: 'victim', scopes: [{ action: 'produce' }] })).id as string

  const noProduce = await makeKey('no-produce', [{ action: 'consume' }, { action: 'metrics' }])
  const noConsume = await makeKey('no-consume', [{ action: 'produce' }, { action: 'metrics' }])
  const noAdmin = await makeKey('no-admin', [{ action: 'produce' }, { action: 'consume' }])
  const patternedAdmin = await makeKey('patterned-admin', [{ action: 'admin', topics: ['*'], groups: ['*'] }])
  const elsewhere = await makeKey('elsewhere', [
    { action: 'admin', topics: ['nomatch*'] },
    { action: 'admin', groups: ['nomatch*'] },
  ])
  const wrongScope = (rule: RouteAccess): string | undefined => {
    if ('action' in rule) return { produce: noProduce, consume: noConsume, admin: noAdmin, metrics: noAdmin }[rule.action]
    return { everything: patternedAdmin, metrics: noAdmin, list: undefined, open: undefined }[rule.on]
  }

  const fill = (url: string) =>
    url
      .replace(':topic', 'orders')
      .replace(':group', 'orders-g')
      .replace(':partition', '0')
      .replace(':name', 'orders-s')
      .replace(':id', url.startsWith('/v1/keys') ? keyToDelete : consumer.id)
  const routes = routeTable(app).filter((r) => r.url.startsWith('/v1/') || r.url === '/metrics')
  t.ok(routes.length >= 28, `the table holds the routes (${routes.length})`)
  for (const route of routes) {
    const name = `${route.method} ${route.url}`
    const rule = route.access
    if (rule === undefined || !('action' in rule || rule.on !== 'open')) {
      t.fail(`${name} declares no access rule, or is open`)
      continue
    }
    const url = fill(route.url)
    const body = ['POST', 'PUT', 'PATCH'].includes(route.method) ? {} : undefined
    const call = (key: string) => app.inject({ method: route.method as 'GET', url, headers: as(key), ...(body ? { payload: body } : {}) })

    const wrong = wrongScope(rule)
    if (wrong !== undefined) t.equal((await call(wrong)).statusCode, 403, `${name}: a key without the scope gets 403`)
    if (rule.on === 'list') {
      const res = await call(elsewhere)
      t.equal(res.statusCode, 200, `${name}: a list route answers`)
      if (route.method === 'GET') t.same(Object.values(res.json())[0], [], `${name}: empty for a key that matches nothing`)
    } else if (rule.on !== 'metrics') {
      const res = await call(elsewhere)
      t.equal(res.statusCode, 403, `${name}: a key whose patterns do not match gets 403`)
      if (route.method !== 'HEAD') t.equal(res.json().code, 'forbidden')
    }
  }
  // Nothing the refused calls asked for happened.
  t.equal((await root('GET', '/v1/topics/orders')).name, 'orders')
  t.equal((await root('GET', '/v1/groups/orders-g/consumers')).consumers.length, 1)
  t.ok((await root('GET', '/v1/keys')).keys.some((k: { id: string }) => k.id === keyToDelete))
  t.equal((await root('GET', '/v1/schedules/orders-s')).topic, 'orders')
})

t.test('a /v1 route without an access rule is refused when it is registered', async (t) => {
  const app = Fastify()
  t.teardown(() => app.close())
  installAuth(app, { keys: ['k'] })
  t.throws(() => app.get('/v1/forgotten', async () => 'open?'), /GET \/v1\/forgotten declares no access rule/)
  app.get('/elsewhere', async () => 'fine')
  app.get('/v1/declared', { config: { access: { on: 'everything' } } }, async () => 'fine')
  await app.ready()
  t.same(
    routeTable(app).map((r) => `${r.method} ${r.url}`),
    ['GET /elsewhere', 'HEAD /elsewhere', 'GET /v1/declared', 'HEAD /v1/declared'],
  )
})

/**
 * A known path with a method no route takes is a 405 method_not_allowed with Allow (issue 13,
 * item 17); an unknown path stays a 404.
 */
import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'

const broker = await startBroker(t, { HOOKQ_API_KEYS: 'ak_root:admin' })
const app = broker.app
const admin = { authorization: 'Bearer ak_root' }

t.test('a wrong method on a known path is a 405 listing the methods the path takes', async (t) => {
  const cases: [string, string, string][] = [
    ['DELETE', '/v1/topics/orders/messages', 'POST'],
    ['PATCH', '/v1/groups/g', 'DELETE, GET, HEAD, PUT'],
    ['POST', '/v1/topics/orders', 'DELETE, GET, HEAD, PUT'],
    ['GET', '/v1/groups/g/acks', 'POST'],
    ['HEAD', '/v1/topics/orders/messages', 'POST'],
    ['DELETE', '/healthz', 'GET, HEAD'],
    ['DELETE', '/v1/topics/orders/messages?x=1', 'POST'],
  ]
  for (const [method, url, allow] of cases) {
    const res = await app.inject({ method: method as 'GET', url, headers: admin })
    t.equal(res.statusCode, 405, `${method} ${url}`)
    t.equal(res.headers.allow, allow, `${method} ${url}: Allow`)
    if (method === 'HEAD') continue // no body
    t.match(res.headers['content-type'], /^application\/problem\+json/)
    t.match(
      res.json(),
      {
        status: 405,
        code: 'method_not_allowed',
        type: /method_not_allowed$/,
        title: String,
        detail: new RegExp(`^${method} is not allowed`),
      },
      `${method} ${url}`,
    )
  }
})

t.test('an unknown path stays a 404 route_not_found', async (t) => {
  for (const [method, url] of [
    ['GET', '/v1/nothing'],
    ['DELETE', '/v1/nothing'],
    ['GET', '/v1/topics/orders/messages/extra'],
  ]) {
    const res = await app.inject({ method: method as 'GET', url, headers: admin })
    t.equal(res.statusCode, 404, `${method} ${url}`)
    t.equal(res.headers.allow, undefined)
    t.equal(res.json().code, 'route_not_found')
  }
})

t.test('like a 404, a 405 is answered before authentication', async (t) => {
  const wrong = await app.inject({ method: 'DELETE', url: '/v1/topics/orders/messages' })
  t.equal(wrong.statusCode, 405)
  t.equal(wrong.headers.allow, 'POST')
  t.equal((await app.inject({ url: '/v1/nothing' })).statusCode, 404)
  t.equal(
    (await app.inject({ method: 'POST', url: '/v1/topics/orders/messages', payload: { messages: [{ value: 1 }] } })).statusCode,
    401,
    'a right method still needs a key',
  )
})

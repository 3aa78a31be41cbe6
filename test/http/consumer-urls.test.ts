/**
 * Consumer URLs that RFC 3986 syntax (the schema's `format: "uri"`) accepts but the WHATWG URL
 * parser, which the pusher uses, refuses: each is a 400 problem, logged as a rejected request
 * (info), never as a failure (error), and nothing is registered.
 */
import { Writable } from 'node:stream'
import t from '../helpers/tap.ts'
import pino from 'pino'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { testDatabase } from '../helpers/db.ts'

const lines: { level: number; msg: string; [k: string]: unknown }[] = []
const sink = new Writable({
  write(chunk: Buffer, _enc, done) {
    lines.push(JSON.parse(chunk.toString('utf8')))
    done()
  },
})
const db = await testDatabase(t)
const broker = await createBroker(loadConfig({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)) }), {
  logger: pino({ level: 'info' }, sink),
})
t.teardown(() => broker.close())
const app = broker.app

t.test('URLs the parser refuses: 400, an info line, nothing stored', async (t) => {
  t.equal((await app.inject({ method: 'PUT', url: '/v1/topics/t', payload: { partitions: 1 } })).statusCode, 201)
  t.equal((await app.inject({ method: 'PUT', url: '/v1/groups/g', payload: { topic: 't' } })).statusCode, 201)
  for (const url of [
    'http://example.com:65536/',
    'http://example.com:99999/',
    'http://example.com:-1/',
    'http://example.com:80:80/',
    'http://127.0.0.1%2F',
    'http://127.0.0.1%00.evil.com',
    'http://xn--localhost/',
  ]) {
    lines.length = 0
    const res = await app.inject({ method: 'POST', url: '/v1/groups/g/consumers', payload: { url } })
    t.equal(res.statusCode, 400, `${url}: ${res.body}`)
    t.match(res.json(), { code: 'invalid_request', detail: /is not a valid URL/ }, url)
    t.same(
      lines.filter((l) => l.level >= 50).map((l) => l.msg),
      [],
      `${url}: no error log line`,
    )
    t.ok(
      lines.some((l) => l.level === 30 && l.msg === 'request rejected'),
      `${url}: logged as a rejected request`,
    )
  }
  t.same((await app.inject({ url: '/v1/groups/g/consumers' })).json().consumers, [], 'nothing was registered')
})

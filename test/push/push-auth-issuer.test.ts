/**
 * The `iss` of push JWTs is one per database: processes started without HOOKQ_PUBLIC_URL, each with
 * a URL of its own, sign with the one the first process recorded (and say so at start-up); one
 * started with HOOKQ_PUBLIC_URL sets it for all, and the others follow at their next key refresh. A
 * process with HOOKQ_PUBLIC_URL never rereads it: one that replaces another value says so (a warning).
 */
import { Writable } from 'node:stream'
import t from '../helpers/tap.ts'
import pino from 'pino'
import { createRemoteJWKSet, jwtVerify } from 'jose'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

// Several broker processes share the database: the embedded one serves a single connection at a time.
if (needsServer) t.plan(0, needsServer)
else await issuer()

async function issuer() {
  const db = await testDatabase(t)
  const receiver = await startReceiver(t)

  /** A broker on the test's database with `env`, and the issuer its start-up log names. */
  async function start(env: Record<string, string>): Promise<{ broker: Broker; said: { issuer: string; level: number; msg: string } }> {
    const lines: string[] = []
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString('utf8'))
        done()
      },
    })
    const broker = await createBroker(
      loadConfig({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_JWT_KEYS_REFRESH_MS: '100', LOG_LEVEL: 'info', ...env }),
      { logger: pino({ level: 'info' }, sink) },
    )
    t.teardown(() => broker.close())
    const said = lines.map((l) => JSON.parse(l)).find((l) => typeof l.issuer === 'string')
    return { broker, said }
  }

  t.test('every process of one database signs with the same iss', async (t) => {
    const a = await start({ HOOKQ_ADVERTISE_URL: 'http://127.0.0.1:1111' })
    const b = await start({ HOOKQ_ADVERTISE_URL: 'http://127.0.0.1:2222' })
    t.equal(a.said.issuer, 'http://127.0.0.1:1111', 'the first process records its own URL')
    t.equal(b.said.issuer, 'http://127.0.0.1:1111', "a second process with another URL signs with the first one's")
    t.equal(b.said.level, 40, 'a warning: HOOKQ_PUBLIC_URL is not set')
    t.match(b.said.msg, /HOOKQ_PUBLIC_URL is not set: push JWTs carry iss http:\/\/127\.0\.0\.1:1111/)

    const { call, produce } = api(a.broker)
    await call('PUT', '/v1/topics/iss', { partitions: 4 })
    await call('PUT', '/v1/groups/iss', { topic: 'iss', ackMode: 'auto' })
    await call('POST', '/v1/groups/iss/consumers', { url: `${receiver.url}/iss`, auth: { type: 'jwt' } })
    const jwksUrl = await b.broker.app.listen({ host: '127.0.0.1', port: 0 })
    const jwks = createRemoteJWKSet(new URL(`${jwksUrl}/.well-known/jwks.json`))
    /** The iss of each push of `values` (pushed by whichever process owns the message's partition). */
    const issuers = async (values: string[]) => {
      await produce(
        'iss',
        values.map((v, i) => ({ value: v, key: `k${i}` })),
      )
      const pushes = await waitUntil(() => {
        const got = receiver.requests.filter((r) => values.includes((r.json as { value: string }).value))
        return got.length >= values.length ? got : undefined
      })
      const seen = new Set<string>()
      for (const p of pushes) {
        const token = String(p.headers.authorization).replace(/^Bearer /, '')
        seen.add(String((await jwtVerify(token, jwks, { audience: `${receiver.url}/iss` })).payload.iss))
      }
      return [...seen]
    }
    t.same(await issuers(['a1', 'a2', 'a3', 'a4', 'a5', 'a6']), ['http://127.0.0.1:1111'])

    const c = await start({ HOOKQ_PUBLIC_URL: 'https://hookq.example/' })
    t.equal(c.said.issuer, 'https://hookq.example', 'HOOKQ_PUBLIC_URL, as given but its trailing slash')
    t.equal(c.said.level, 40, 'a warning: the iss consumers see changes')
    t.match(c.said.msg, /HOOKQ_PUBLIC_URL https:\/\/hookq\.example replaces the recorded iss http:\/\/127\.0\.0\.1:1111/)
    const again = await start({ HOOKQ_PUBLIC_URL: 'https://hookq.example' })
    t.equal(again.said.level, 30, 'the same HOOKQ_PUBLIC_URL again: no warning')
    await again.broker.close()
    await c.broker.close()
    // The processes without HOOKQ_PUBLIC_URL reread the recorded iss with their keys (every 100 ms here).
    await waitUntil(async () => {
      const seen = await issuers([`b${Date.now()}`])
      return seen.length === 1 && seen[0] === 'https://hookq.example'
    })
    t.same(await issuers(['c1', 'c2', 'c3', 'c4', 'c5', 'c6']), ['https://hookq.example'], 'all follow HOOKQ_PUBLIC_URL')
  })

  t.test('two processes with different HOOKQ_PUBLIC_URL: the second says that the first keeps its own', async (t) => {
    const first = await start({ HOOKQ_PUBLIC_URL: 'https://one.example' })
    t.equal(first.said.issuer, 'https://one.example')
    const second = await start({ HOOKQ_PUBLIC_URL: 'https://two.example' })
    t.equal(second.said.issuer, 'https://two.example')
    t.equal(second.said.level, 40)
    t.match(
      second.said.msg,
      /replaces the recorded iss https:\/\/one\.example.*HOOKQ_PUBLIC_URL=https:\/\/one\.example, if any, keeps signing with that until it is restarted/,
    )
    await second.broker.close()
    await first.broker.close()
  })
}

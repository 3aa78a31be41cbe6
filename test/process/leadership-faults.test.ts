/**
 * Leadership under the faults that no signal announces, and forwarding against a stand-in leader:
 * - a leader cut off from PostgreSQL without a reset (packets dropped: a partition, a frozen VM)
 *   gives up pushing when its heartbeat goes unanswered, and the server ends its silent session
 *   (idle_session_timeout), so a follower takes over within seconds, not at TCP keepalive's 2 h;
 * - a follower relays the leader's answers (status, problem, Retry-After) and forwards the caller's
 *   method, path, query and key; a leader that dies mid-answer is 503 with Retry-After.
 * Found by review of the first version, which had neither the heartbeat nor the session timeout.
 */
import t from 'tap'
import http from 'node:http'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, leads, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  return c
}

t.test('a leader cut off from the database without a reset is replaced', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const url = new URL(db.url)
  const p = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => p.close())
  const viaProxy = new URL(db.url); viaProxy.host = `127.0.0.1:${p.port}`
  const procs: BrokerProcess[] = []
  t.teardown(() => { for (const b of procs) if (b.child.exitCode === null) b.child.kill('SIGKILL') })
  const a = await spawnBroker({ DATABASE_URL: viaProxy.href, HOOKQ_LEADER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }, 60_000)
  procs.push(a)
  await waitUntil(() => leads(a), 15_000, 'A leads')
  const b = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_LEADER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }, 60_000)
  procs.push(b)
  const receiver = await startReceiver(t)
  t.equal((await call(b.url, 'PUT', '/v1/topics/cut', { partitions: 1 })).status, 201)
  t.equal((await call(b.url, 'PUT', '/v1/groups/cut-g', { topic: 'cut' })).status, 201)
  t.equal((await call(b.url, 'POST', '/v1/groups/cut-g/consumers', { url: receiver.url })).status, 201)
  t.equal((await call(b.url, 'POST', '/v1/topics/cut/messages', { messages: [{ value: 0 }] })).status, 201)
  await receiver.waitFor(1, 20_000)

  p.silence() // A's packets go nowhere; its sessions stay open on the server
  t.equal((await call(b.url, 'POST', '/v1/topics/cut/messages', { messages: [{ value: 1 }] })).status, 201)
  await waitUntil(() => leads(b), 30_000, 'B leads (A gave up on its heartbeat)')
  t.pass('B takes over (A gave up on its heartbeat; the server ended its silent session)')
  t.notOk(await leads(a), 'A, cut off, no longer leads')
  await waitUntil(() => receiver.requests.some((r) => (r.json as { value: number }).value === 1), 20_000, 'value 1 pushed after the cut')
  t.pass('the message produced after the cut is pushed')
})

t.test('what a follower relays', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = await client(db.url)
  t.teardown(() => c.end())
  t.equal((await c.query('SELECT pg_try_advisory_lock($1) AS ok', [0x686b714c])).rows[0].ok, true)
  const seen: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[] = []
  let behaviour: (req: http.IncomingMessage, res: http.ServerResponse) => void = (_q, res) => res.end()
  const fake = http.createServer((req, res) => {
    let body = ''
    req.on('data', (d) => { body += d })
    req.on('end', () => { seen.push({ method: req.method!, url: req.url!, headers: req.headers, body }); behaviour(req, res) })
  })
  await new Promise<void>((r) => fake.listen(0, '127.0.0.1', r))
  t.teardown(() => { fake.closeAllConnections(); fake.close() })
  const fakeUrl = `http://127.0.0.1:${(fake.address() as { port: number }).port}`
  await c.query(`INSERT INTO broker_leader (id, url, backend_pid) VALUES (1, $1, pg_backend_pid())`, [fakeUrl])

  const b = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_LEADER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }, 60_000)
  t.teardown(() => { if (b.child.exitCode === null) b.child.kill('SIGKILL') })
  t.notOk(await leads(b), 'the broker follows')

  // Shapes of forwarded requests, and relay of a problem with Retry-After.
  behaviour = (_q, res) => {
    res.writeHead(429, { 'content-type': 'application/problem+json', 'retry-after': '7', 'x-other': 'no' })
    res.end(JSON.stringify({ type: 'urn:hookq:problem:rate_limited', title: 'Rate limited', status: 429, detail: 'slow down', code: 'rate_limited' }))
  }
  seen.length = 0
  const r1 = await call(b.url, 'POST', '/v1/groups/g/nacks?x=1', { deliveryIds: ['d1'], delayMs: 5 }, { authorization: 'Bearer k' })
  const r2 = await call(b.url, 'GET', '/v1/groups/g', undefined, { authorization: 'Bearer k' })
  t.equal(seen[0]?.url, '/v1/groups/g/nacks?x=1', 'path and query forwarded')
  t.equal(seen[0]?.headers.authorization, 'Bearer k', 'the key forwarded')
  t.equal(seen[0]?.headers['hookq-forwarded'], '1', 'marked as forwarded')
  t.same(JSON.parse(seen[0]?.body ?? '{}'), { deliveryIds: ['d1'], delayMs: 5 }, 'the body forwarded')
  t.same(seen.map((s) => s.method), ['POST', 'GET'], 'both methods forwarded as sent')
  t.equal(seen[1]?.body, '', 'no body on a GET')
  t.equal(r2.status, 429, "the forwarded GET's answer relayed")
  t.equal(r1.status, 429)
  t.equal(r1.headers.get('retry-after'), '7')
  t.equal(r1.json.code, 'rate_limited', 'the problem relayed')
  t.equal(r1.headers.get('x-other'), null, 'other headers are not relayed')

  // A leader that dies after its headers, before its body ends: the caller should get 503 + Retry-After.
  behaviour = (_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' })
    res.write('{"results":[')
    setTimeout(() => res.socket?.destroy(), 50)
  }
  const mid = await call(b.url, 'POST', '/v1/groups/g/acks', { deliveryIds: ['d1'] })
  t.comment(`leader died mid-body: ${mid.status} ${JSON.stringify(mid.json)} retry-after=${mid.headers.get('retry-after')}`)
  t.equal(mid.status, 503, 'a leader dying mid-answer is 503 unavailable, like one that does not answer')
  t.equal(mid.headers.get('retry-after'), '1', 'with Retry-After')
})

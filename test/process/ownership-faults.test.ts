/**
 * Ownership under the faults that no signal announces, and forwarding against a stand-in owner:
 * - a process cut off from PostgreSQL without a reset (packets dropped: a partition, a frozen VM)
 *   stops pushing when its poll goes unanswered, and the server ends its silent session
 *   (idle_session_timeout), so another process takes its partitions within seconds, not at TCP
 *   keepalive's 2 h;
 * - acks for a partition another process owns are forwarded to it with the caller's method, path,
 *   query and key, and its failures relayed (status, problem, Retry-After); an owner that dies
 *   mid-answer is 503 with Retry-After.
 */
import t from '../helpers/tap.ts'
import http from 'node:http'
import pg from 'pg'
import { newDeliveryId } from '../../src/core/delivery-id.ts'
import { MEMBERS_LOCK_KEY, partitionLockKey } from '../../src/store/membership.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  return c
}

/** Partitions a process says it owns (hookq_partitions_owned); throws when it does not answer. */
async function owned(b: BrokerProcess): Promise<number> {
  const text = String((await call(b.url, 'GET', '/metrics', undefined, {}, 5000)).json)
  return Number(/^hookq_partitions_owned (\d+)$/m.exec(text)?.[1] ?? -1)
}

t.test('a process cut off from the database without a reset loses its partitions to the others', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const url = new URL(db.url)
  const p = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => p.close())
  const viaProxy = new URL(db.url)
  viaProxy.host = `127.0.0.1:${p.port}`
  const procs: BrokerProcess[] = []
  t.teardown(() => {
    for (const b of procs) if (b.child.exitCode === null) b.child.kill('SIGKILL')
  })
  const a = await spawnBroker({ DATABASE_URL: viaProxy.href, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' })
  procs.push(a)
  const b = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' })
  procs.push(b)
  const receiver = await startReceiver(t)
  t.equal((await call(b.url, 'PUT', '/v1/topics/cut', { partitions: 2 })).status, 201)
  t.equal((await call(b.url, 'PUT', '/v1/groups/cut-g', { topic: 'cut' })).status, 201)
  t.equal((await call(b.url, 'POST', '/v1/groups/cut-g/consumers', { url: receiver.url })).status, 201)
  await waitUntil(async () => (await owned(a)) === 1 && (await owned(b)) === 1, 60_000, 'one partition each')
  t.equal(
    (
      await call(b.url, 'POST', '/v1/topics/cut/messages', {
        messages: [
          { value: 0, partition: 0 },
          { value: 1, partition: 1 },
        ],
      })
    ).status,
    201,
  )
  await receiver.waitFor(2, 30_000)

  p.silence() // A's packets go nowhere; its sessions stay open on the server
  t.equal(
    (
      await call(b.url, 'POST', '/v1/topics/cut/messages', {
        messages: [
          { value: 2, partition: 0 },
          { value: 3, partition: 1 },
        ],
      })
    ).status,
    201,
  )
  await waitUntil(async () => (await owned(b)) === 2, 30_000, 'B owns both partitions (A gave up; the server ended its silent session)')
  t.pass("B took A's partition")
  t.equal(await owned(a), 0, 'A, cut off, owns nothing')
  await waitUntil(
    () => [2, 3].every((v) => receiver.requests.some((r) => (r.json as { value: number }).value === v)),
    30_000,
    'both messages produced after the cut pushed',
  )
  t.pass('the messages produced after the cut are pushed, on both partitions')
})

t.test('what is forwarded to an owner, and what of its answer is relayed', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = await client(db.url)
  t.teardown(() => c.end())
  let behaviour: (req: http.IncomingMessage, res: http.ServerResponse) => void = (_q, res) => res.end()
  const seen: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[] = []
  const fake = http.createServer((req, res) => {
    let body = ''
    req.on('data', (d) => {
      body += d
    })
    req.on('end', () => {
      seen.push({ method: req.method!, url: req.url!, headers: req.headers, body })
      behaviour(req, res)
    })
  })
  await new Promise<void>((r) => fake.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    fake.closeAllConnections()
    fake.close()
  })
  const fakeUrl = `http://127.0.0.1:${(fake.address() as { port: number }).port}`
  // A stand-in member that owns partition 0 of the first group the database will have (id 1).
  await c.query('SELECT pg_advisory_lock_shared($1)', [MEMBERS_LOCK_KEY])
  await c.query(`INSERT INTO broker_members (backend_pid, url) VALUES (pg_backend_pid(), $1)`, [fakeUrl])
  t.equal((await c.query('SELECT pg_try_advisory_lock($1::bigint) AS ok', [partitionLockKey(1, 0)])).rows[0].ok, true)

  const b = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' })
  t.teardown(() => {
    if (b.child.exitCode === null) b.child.kill('SIGKILL')
  })
  t.equal((await call(b.url, 'PUT', '/v1/topics/t1', { partitions: 2 })).status, 201)
  t.equal((await call(b.url, 'PUT', '/v1/groups/g', { topic: 't1' })).status, 201)
  const groupId = (await c.query(`SELECT id FROM consumer_groups WHERE name = 'g'`)).rows[0].id as number
  t.equal(groupId, 1, 'the group the stand-in owns partition 0 of')
  await waitUntil(
    async () => Number(/^hookq_partitions_owned (\d+)$/m.exec(String((await call(b.url, 'GET', '/metrics')).json))?.[1]) === 1,
    30_000,
    'the broker owns partition 1 only',
  )
  const remoteId = newDeliveryId({ groupId, partition: 0, offset: 0, attempt: 1 })
  const localId = newDeliveryId({ groupId, partition: 1, offset: 0, attempt: 1 })

  // Shapes of forwarded requests, and relay of a problem with Retry-After.
  behaviour = (_q, res) => {
    res.writeHead(429, { 'content-type': 'application/problem+json', 'retry-after': '7', 'x-other': 'no' })
    res.end(
      JSON.stringify({
        type: 'urn:hookq:problem:rate_limited',
        title: 'Rate limited',
        status: 429,
        detail: 'slow down',
        code: 'rate_limited',
      }),
    )
  }
  seen.length = 0
  const r1 = await call(
    b.url,
    'POST',
    '/v1/groups/g/nacks?x=1',
    { deliveryIds: [remoteId, localId], delayMs: 5 },
    { authorization: 'Bearer k' },
  )
  t.equal(seen[0]?.url, '/v1/groups/g/nacks?x=1', 'path and query forwarded')
  t.equal(seen[0]?.method, 'POST')
  t.equal(seen[0]?.headers.authorization, 'Bearer k', 'the key forwarded')
  t.equal(seen[0]?.headers['hookq-forwarded'], '1', 'marked as forwarded')
  t.same(
    JSON.parse(seen[0]?.body ?? '{}'),
    { deliveryIds: [remoteId], delayMs: 5 },
    "only the owner's ids forwarded, the rest of the body as sent",
  )
  t.equal(r1.status, 429)
  t.equal(r1.headers.get('retry-after'), '7')
  t.equal(r1.json.code, 'rate_limited', 'the problem relayed')
  t.equal(r1.headers.get('x-other'), null, 'other headers are not relayed')

  // The owner answers: its results and this process's are merged in request order.
  behaviour = (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ results: [{ deliveryId: remoteId, status: 'already_completed' }] }))
  }
  const merged = await call(b.url, 'POST', '/v1/groups/g/acks', { deliveryIds: [localId, remoteId] })
  t.equal(merged.status, 200)
  t.same(
    merged.json.results,
    [
      { deliveryId: localId, status: 'unknown' },
      { deliveryId: remoteId, status: 'already_completed' },
    ],
    'answers merged in request order',
  )

  // A forwarded call for a partition this process does not own is not forwarded on: 503.
  const loop = await call(b.url, 'POST', '/v1/groups/g/acks', { deliveryIds: [remoteId] }, { 'hookq-forwarded': '1' })
  t.equal(loop.status, 503)
  t.equal(loop.json.code, 'unavailable')
  t.ok(Number(loop.retryAfter) >= 1, 'with Retry-After')

  // An owner that dies after its headers, before its body ends: the caller gets 503 + Retry-After.
  behaviour = (_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' })
    res.write('{"results":[')
    setTimeout(() => res.socket?.destroy(), 50)
  }
  const mid = await call(b.url, 'POST', '/v1/groups/g/acks', { deliveryIds: [remoteId] })
  t.equal(mid.status, 503, 'an owner dying mid-answer is 503 unavailable, like one that does not answer')
  t.equal(mid.headers.get('retry-after'), '1', 'with Retry-After')
})

t.test(
  'a process paused past its session and resumed cannot complete or push for the partitions it lost',
  { skip: needsServer },
  async (t) => {
    const db = await testDatabase(t)
    const env = { DATABASE_URL: db.url, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }
    const procs: BrokerProcess[] = []
    t.teardown(() => {
      for (const b of procs) {
        b.child.kill('SIGCONT')
        if (b.child.exitCode === null) b.child.kill('SIGKILL')
      }
    })
    const [a, b] = await Promise.all([spawnBroker(env), spawnBroker(env)])
    procs.push(a, b)
    const receiver = await startReceiver(t)
    t.equal((await call(a.url, 'PUT', '/v1/topics/fence', { partitions: 2 })).status, 201)
    // Explicit acks with a short deadline: a paused owner's timers are all due when it resumes.
    t.equal(
      (
        await call(a.url, 'PUT', '/v1/groups/fence-g', {
          topic: 'fence',
          ackMode: 'explicit',
          ackTimeoutMs: 1000,
          retry: { initialDelayMs: 100, multiplier: 1, maxDelayMs: 100, jitter: 0 },
          maxDeliveries: 50,
        })
      ).status,
      201,
    )
    t.equal((await call(a.url, 'POST', '/v1/groups/fence-g/consumers', { url: receiver.url })).status, 201)
    await waitUntil(async () => (await owned(a)) === 1 && (await owned(b)) === 1, 60_000, 'one partition each')
    const c = await client(db.url)
    t.teardown(() => c.end())
    const mine = (
      await c.query(
        `SELECT l.objid::int AS p FROM pg_locks l JOIN broker_members m ON m.backend_pid = l.pid
    WHERE m.url = $1 AND l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.classid::bigint >= $2`,
        [a.url, 0x48000000],
      )
    ).rows[0].p as number
    t.equal((await call(a.url, 'POST', '/v1/topics/fence/messages', { messages: [{ value: 'x', partition: mine }] })).status, 201)
    await receiver.waitFor(1, 30_000)

    // A owns the message's partition and is frozen with it out; the server ends its silent session
    // (idle_session_timeout about 4 s here) and B takes the partition, pushing the message again.
    a.child.kill('SIGSTOP')
    const frozenAt = receiver.requests.length
    await waitUntil(() => receiver.requests.length > frozenAt, 30_000, 'B pushes the message after A froze')
    const byB = receiver.requests[receiver.requests.length - 1]!
    t.pass(`B pushed it as attempt ${String(byB.headers['hookq-attempt'])}`)
    const oldId = (receiver.requests[0]!.json as { deliveryId: string }).deliveryId

    // A resumes: its due retries and an ack sent straight to it (marked forwarded, so it answers itself)
    // must all be refused: the partition's epoch is B's now.
    a.child.kill('SIGCONT')
    const ack = await call(a.url, 'POST', '/v1/groups/fence-g/acks', { deliveryIds: [oldId] }, { 'hookq-forwarded': '1' })
    t.equal(ack.status, 503, 'an ack A can no longer commit is 503, not acked')
    await waitUntil(
      async () => /^hookq_partitions_owned 0$/m.test(String((await call(a.url, 'GET', '/metrics')).json)),
      30_000,
      'A knows it owns nothing',
    )
    // Every push since the freeze is by the partition's owner of the moment (B, or A once given it
    // back with a new epoch): attempt numbers never repeat (a push by the fenced A would repeat one
    // of B's, since A counted its own attempts from memory).
    const attempts = receiver.requests.map((r) => Number(r.headers['hookq-attempt']))
    t.same(attempts, [...new Set(attempts)], `no attempt number pushed twice (${attempts.join(', ')})`)
    // A, back as a member, may be given the partition again (two members, two partitions): an ack
    // that meets the move is answered 503 with Retry-After, and a client sends it again, as here.
    // (A CI run saw epoch 3: A pushed attempt 3 after B's attempt 2 was abandoned for the move.)
    const lastId = (receiver.requests.at(-1)!.json as { deliveryId: string }).deliveryId
    const committed = await waitUntil(
      async () => {
        const r = await call(b.url, 'POST', '/v1/groups/fence-g/acks', { deliveryIds: [lastId] })
        return r.status === 503 ? undefined : r
      },
      30_000,
      'the ack taken once no move is under way',
      250,
    )
    t.equal(committed.status, 200)
    t.equal(committed.json.results[0].status, 'acked', 'acked through B, by whichever process owns the partition now')
  },
)

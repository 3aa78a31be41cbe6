/**
 * Several broker processes on one database: exactly one pushes (the leader), every one serves the
 * API, and calls only the leader can serve are forwarded to it. When the leader is SIGKILLed or
 * stopped, another takes over within a few polls, and nothing acked is pushed again.
 */
import t from 'tap'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, leads, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('one process pushes; the others forward; a killed leader is replaced', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const env = { DATABASE_URL: db.url, HOOKQ_LEADER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }
  const procs: BrokerProcess[] = []
  t.teardown(() => { for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL') })
  const spawn = async () => { const p = await spawnBroker(env, 60_000); procs.push(p); return p }
  const a = await spawn()
  const b = await spawn()
  await waitUntil(async () => (await leads(a)) !== (await leads(b)), 15_000, 'exactly one leader')
  const [leader, follower] = (await leads(a)) ? [a, b] : [b, a]
  t.pass(`leader pid ${leader.child.pid}, follower pid ${follower.child.pid}`)

  // Everything set up and produced through the follower; the leader pushes.
  const receiver = await startReceiver(t)
  t.equal((await call(follower.url, 'PUT', '/v1/topics/ha', { partitions: 3 })).status, 201)
  t.equal((await call(follower.url, 'PUT', '/v1/groups/ha-g', { topic: 'ha', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
  t.equal((await call(follower.url, 'POST', '/v1/groups/ha-g/consumers', { url: receiver.url })).status, 201)
  const produce = async (base: string, from: number, n: number) =>
    t.equal((await call(base, 'POST', '/v1/topics/ha/messages', { messages: Array.from({ length: n }, (_, i) => ({ value: from + i })) })).status, 201)
  await produce(follower.url, 0, 30)
  await receiver.waitFor(30, 20_000)

  // Acks through either process: the follower forwards them to the leader.
  const acked = new Set<string>() // webhook-ids whose ack was answered 'acked'
  const ackAll = async (via: string) => {
    const pending = receiver.requests.filter((r) => !acked.has(String(r.headers['webhook-id'])))
    const ids = pending.map((r) => (r.json as { deliveryId: string }).deliveryId)
    if (ids.length === 0) return
    const res = await call(via, 'POST', '/v1/groups/ha-g/acks', { deliveryIds: ids })
    t.equal(res.status, 200, `acks through ${via === follower.url ? 'the follower' : 'the leader'}`)
    res.json.results.forEach((r: { status: string }, i: number) => { if (r.status === 'acked') acked.add(String(pending[i]!.headers['webhook-id'])) })
  }
  await ackAll(follower.url)
  t.equal(acked.size, 30, 'every ack sent through the follower was acked by the leader')
  const status = await call(follower.url, 'GET', '/v1/groups/ha-g')
  t.equal(status.status, 200, 'the group status through the follower')
  await waitUntil(async () => (await call(follower.url, 'GET', '/v1/groups/ha-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
    15_000, 'lag 0, seen through the follower')

  // A forwarded call never travels on: a process that is not the leader answers 503.
  const loop = await call(follower.url, 'POST', '/v1/groups/ha-g/acks', { deliveryIds: ['x'] }, { 'hookq-forwarded': '1' })
  t.equal(loop.status, 503)
  t.equal(loop.json.code, 'unavailable')
  t.ok(Number(loop.retryAfter) >= 1, 'with Retry-After')

  // Messages in flight, then the leader dies without warning: the follower takes over.
  await produce(follower.url, 30, 30)
  await receiver.waitFor(60, 20_000)
  leader.child.kill('SIGKILL')
  await leader.exited
  await waitUntil(() => leads(follower), 15_000, 'the follower leads')
  t.pass('the follower took over')
  await produce(follower.url, 60, 30)
  // The 30 unacked ones come again (their attempts died with the leader), plus the 30 new ones.
  await waitUntil(() => new Set(receiver.requests.map((r) => (r.json as { value: number }).value)).size === 90, 30_000, 'all 90 values pushed')
  await waitUntil(async () => { await ackAll(follower.url); return acked.size === 90 }, 30_000, 'all 90 acked', 300)
  await waitUntil(async () => (await call(follower.url, 'GET', '/v1/groups/ha-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
    30_000, 'lag 0 after the takeover')
  const values = receiver.requests.map((r) => (r.json as { value: number }).value)
  t.same([...new Set(values)].sort((x, y) => x - y), Array.from({ length: 90 }, (_, i) => i), 'every message pushed')
  // Values 0..29 were acked before the kill: each must have been pushed exactly once, in total.
  const pushes = new Map<number, number>()
  for (const v of values) pushes.set(v, (pushes.get(v) ?? 0) + 1)
  t.same(Array.from({ length: 30 }, (_, v) => pushes.get(v) ?? 0), Array(30).fill(1),
    'nothing acked before the kill was pushed again (each of 0..29 pushed exactly once)')

  // A graceful stop hands over too: a new process joins as follower, the leader stops, it takes over.
  const c = await spawn() // it listens only after its first campaign, so it already knows it follows
  t.notOk(await leads(c), 'a newcomer follows')
  t.equal((await call(c.url, 'GET', '/v1/groups/ha-g')).status, 200, 'the newcomer forwards to the leader')
  follower.child.kill('SIGTERM')
  t.equal(await follower.exited, 0, 'the old leader exits 0')
  await waitUntil(() => leads(c), 15_000, 'the newcomer leads')
  await produce(c.url, 90, 5)
  await waitUntil(() => new Set(receiver.requests.map((r) => (r.json as { value: number }).value)).size === 95, 20_000, 'pushed by the new leader')
  t.pass('the newcomer pushes')
})

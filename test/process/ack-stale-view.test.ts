/**
 * An ack reaching a process whose view of the owners is stale (its last poll saw an owner that has
 * since been killed, and another process has taken the partition) goes to the partition's holder
 * found afresh, not answered 503 (issue 29: most 503s on acks after a SIGKILL were "did not answer"
 * or "moving" from a view up to a poll old). c polls every 30 s, so its view stays stale.
 */
import t from 'tap'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { callBroker as call, spawnBroker, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('an ack through a process with a stale view reaches the new holder', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c0 = new pg.Client({ connectionString: db.url })
  await c0.connect()
  t.teardown(() => c0.end())
  const procs: BrokerProcess[] = []
  t.teardown(() => {
    for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL')
  })
  const spawn = async (pollMs: number) => {
    const p = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_CLUSTER_POLL_MS: String(pollMs) }, 120_000)
    procs.push(p)
    return p
  }
  const heldBy = async () =>
    (
      await c0.query(
        `SELECT array_agg(DISTINCT pid) AS pids, count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND mode = 'ExclusiveLock' AND classid <> 0
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      )
    ).rows[0] as { pids: number[] | null; n: number }

  const a = await spawn(200)
  const receiver = await startReceiver(t)
  t.equal((await call(a.url, 'PUT', '/v1/topics/sv', { partitions: 2 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/sv-g', { topic: 'sv', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/sv-g/consumers', { url: receiver.url })).status, 201)
  const messages = Array.from({ length: 10 }, (_, i) => ({ key: `k${i}`, value: i }))
  t.equal((await call(a.url, 'POST', '/v1/topics/sv/messages', { messages })).status, 201)
  await receiver.waitFor(10, 30_000)
  const ids = receiver.requests.map((r) => (r.json as { deliveryId: string }).deliveryId)

  // c sees a holding both partitions, and keeps that view; a dies; d takes its share (one partition).
  const c = await spawn(30_000)
  a.child.kill('SIGKILL')
  await a.exited
  const d = await spawn(200)
  await waitUntil(async () => (await heldBy()).n === 1, 30_000, 'd holds one partition')

  const res = await call(c.url, 'POST', '/v1/groups/sv-g/acks', { deliveryIds: ids })
  if (res.status !== 200) t.comment(JSON.stringify(res.json))
  t.equal(res.status, 200, 'acks through the process with a stale view answered 200, not 503')
  t.same(
    res.json.results.filter((r: { status: string }) => r.status !== 'acked' && r.status !== 'already_completed'),
    [],
    'every ack written',
  )
  await waitUntil(
    async () => (await call(d.url, 'GET', '/v1/groups/sv-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
    30_000,
    'lag 0',
  )
})

// HOOKQ_PROCESSES=2: one command, two broker processes on one port. Both take calls (one pushes,
// the other forwards acks to it over its own loopback port), a process that dies is started again
// while the other keeps serving, and SIGTERM stops them all with exit 0.
import { execFileSync } from 'node:child_process'
import t from 'tap'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

/** The pids of `pid`'s child processes. */
const childrenOf = (pid: number): number[] => {
  try {
    return execFileSync('pgrep', ['-P', String(pid)], { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number)
  } catch { return [] } // pgrep exits 1 when there are none
}

t.test('two broker processes from one command', { skip: needsServer }, async (t) => {
  const env = { DATABASE_URL: (await testDatabase(t)).url, HOOKQ_PROCESSES: '2', HOOKQ_LEADER_POLL_MS: '200' }
  const broker = await spawnBroker(env, 60_000)
  t.teardown(() => { for (const pid of childrenOf(broker.child.pid!)) process.kill(pid, 'SIGKILL'); broker.child.kill('SIGKILL') })
  await waitUntil(() => childrenOf(broker.child.pid!).length === 2, 30_000, 'two broker processes')

  /** hookq_leader of whichever process answers a fresh connection. */
  const leaderGauge = async () => /^hookq_leader (\d)/m.exec(String((await call(broker.url, 'GET', '/metrics', undefined, { connection: 'close' })).json))?.[1]
  const bothAnswer = async () => {
    const seen = new Set<string | undefined>()
    for (let i = 0; i < 20 && seen.size < 2; i++) seen.add(await leaderGauge())
    return seen.has('1') && seen.has('0')
  }
  await waitUntil(bothAnswer, 30_000, 'the leader and the other process both answer on the port')

  const acked: string[] = []
  const receiver = await startReceiver(t, (req) => {
    const id = (req.json as { deliveryId: string }).deliveryId
    // Acked through the shared port: about half of them reach the process that does not push.
    void call(broker.url, 'POST', '/v1/groups/g/acks', { deliveryIds: [id] }, { connection: 'close' })
      .then((r) => { if (r.status === 200 && r.json.results[0].status === 'acked') acked.push(id) }, () => {})
    return { status: 200 }
  })
  t.equal((await call(broker.url, 'PUT', '/v1/topics/p', { partitions: 2 })).status, 201)
  t.equal((await call(broker.url, 'PUT', '/v1/groups/g', { topic: 'p' })).status, 201)
  t.equal((await call(broker.url, 'POST', '/v1/groups/g/consumers', { url: receiver.url })).status, 201)
  const lagZero = async () => (await call(broker.url, 'GET', '/v1/groups/g')).json.partitions?.every((p: { lag: number; inFlight: number }) => p.lag === 0 && p.inFlight === 0)

  for (let i = 0; i < 10; i++) {
    t.equal((await call(broker.url, 'POST', '/v1/topics/p/messages', { messages: Array.from({ length: 5 }, (_, j) => ({ value: i * 5 + j })) })).status, 201)
  }
  await waitUntil(lagZero, 30_000, 'every message pushed and acked through either process')
  t.ok(acked.length >= 50, `${acked.length} acks answered acked`)

  // One process dies: the primary starts another; the port keeps answering meanwhile.
  const [victim] = childrenOf(broker.child.pid!)
  process.kill(victim!, 'SIGKILL')
  await waitUntil(() => { const c = childrenOf(broker.child.pid!); return c.length === 2 && !c.includes(victim!) }, 30_000, 'a new process in its place')
  await waitUntil(bothAnswer, 30_000, 'two processes answer again, one of them pushing')
  t.equal((await call(broker.url, 'POST', '/v1/topics/p/messages', { messages: Array.from({ length: 10 }, (_, j) => ({ value: 100 + j })) })).status, 201)
  await waitUntil(lagZero, 30_000, 'messages produced after the restart pushed and acked too')
  t.match(broker.output(), /a broker process exited; starting another/)

  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0, 'SIGTERM: every process stopped cleanly')
  t.same(childrenOf(broker.child.pid!), [], 'no broker process left')
})

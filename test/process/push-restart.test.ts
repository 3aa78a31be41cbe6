// SIGKILL of the broker mid-stream: after a restart on the same database pushing resumes from the
// committed offsets, what was in flight is pushed again, and nothing acked is pushed again.
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('SIGKILL mid-stream loses nothing and re-pushes nothing acked', async (t) => {
  let env: Record<string, string>
  if (databaseServerUrl) {
    env = { DATABASE_URL: (await testDatabase(t)).url }
  } else {
    const dataDir = await mkdtemp(join(tmpdir(), 'hookq-push-restart-'))
    t.teardown(() => rm(dataDir, { recursive: true, force: true }))
    env = { HOOKQ_DATA_DIR: dataDir }
  }
  let broker: BrokerProcess = await spawnBroker(env, 60_000)
  t.teardown(() => { broker.child.kill('SIGKILL') })
  let base = broker.url

  const acked = new Set<string>() // "partition:offset" whose ack was answered `acked`
  const pushes: { key: string; at: number; generation: number }[] = []
  let generation = 1
  // The consumer answers 200 at once and acks a moment later over HTTP, like a consumer library.
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { deliveryId: string; partition: number; offset: number }
    const key = `${env.partition}:${env.offset}`
    pushes.push({ key, at: Date.now(), generation })
    const target = base
    setTimeout(() => {
      call(target, 'POST', '/v1/groups/g/acks', { deliveryIds: [env.deliveryId] })
        .then((r) => { if (r.status === 200 && r.json.results[0].status === 'acked') acked.add(key) })
        .catch(() => {}) // the broker was killed: this ack's outcome is unknown
    }, 5)
    return { status: 200 }
  })

  t.equal((await call(base, 'PUT', '/v1/topics/stream', { partitions: 2 })).status, 201)
  t.equal((await call(base, 'PUT', '/v1/groups/g', { topic: 'stream', ackTimeoutMs: 3000, pushTimeoutMs: 2000, maxInFlight: 20 })).status, 201)
  t.equal((await call(base, 'POST', '/v1/groups/g/consumers', { url: receiver.url })).status, 201)

  const TOTAL = 400
  for (let i = 0; i < TOTAL; i += 50) {
    const res = await call(base, 'POST', '/v1/topics/stream/messages', { messages: Array.from({ length: 50 }, (_, j) => ({ value: i + j })) })
    t.equal(res.status, 201)
  }
  await waitUntil(() => acked.size >= 100, 30_000, '100 acks before the kill')
  broker.child.kill('SIGKILL')
  t.equal(await broker.exited, 'SIGKILL')
  const ackedBeforeKill = new Set(acked)
  generation = 2

  broker = await spawnBroker(env, 60_000)
  base = broker.url
  await waitUntil(async () => {
    const s = await call(base, 'GET', '/v1/groups/g')
    return s.json.partitions.every((p: { lag: number }) => p.lag === 0)
  }, 60_000, 'every message completed after the restart')

  const received = new Set(pushes.map((p) => p.key))
  t.equal(received.size, TOTAL, 'every message was pushed')
  const repushedAcked = pushes.filter((p) => p.generation === 2 && ackedBeforeKill.has(p.key))
  t.same(repushedAcked, [], 'nothing acked before the kill was pushed again')
  const duplicates = pushes.length - received.size
  t.comment(`${pushes.length} pushes for ${TOTAL} messages: ${duplicates} duplicates (allowed: in flight or acked-unconfirmed at the kill)`)
  const status = await call(base, 'GET', '/v1/groups/g')
  t.same(status.json.partitions.map((p: { committedOffset: number; endOffset: number }) => p.committedOffset === p.endOffset), [true, true])
  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0)
})

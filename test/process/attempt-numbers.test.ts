// Attempt numbers across SIGKILLs: a message is never pushed twice with one attempt number, and
// maxDeliveries bounds its pushes however often the broker dies. The consumer takes every push
// (200) and never acks, so every message stays in flight and its attempt rows are the newest ones
// when the broker is killed: with attempt rows written only after the push, the next process
// pushed these messages as attempt 1 again.
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from '../helpers/tap.ts'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('attempt numbers strictly increase per message across SIGKILLs, and maxDeliveries bounds the pushes', async (t) => {
  let env: Record<string, string>
  if (databaseServerUrl) {
    env = { DATABASE_URL: (await testDatabase(t)).url }
  } else {
    const dataDir = await mkdtemp(join(tmpdir(), 'hookq-attempts-'))
    t.teardown(() => rm(dataDir, { recursive: true, force: true }))
    env = { HOOKQ_DATA_DIR: dataDir }
  }
  let broker: BrokerProcess = await spawnBroker(env)
  t.teardown(() => {
    broker.child.kill('SIGKILL')
  })

  const pushes: { offset: number; attempt: number }[] = []
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { offset: number; attempt: number }
    pushes.push({ offset: env.offset, attempt: env.attempt })
    return { status: 200 }
  })
  const MAX_DELIVERIES = 3
  const TOTAL = 40
  t.equal((await call(broker.url, 'PUT', '/v1/topics/a', { partitions: 1 })).status, 201)
  // A long ack deadline: within one process's life nothing is retried, so every later attempt
  // comes from a restart, which must count the attempts the killed process made.
  t.equal(
    (
      await call(broker.url, 'PUT', '/v1/groups/g', {
        topic: 'a',
        ackTimeoutMs: 60_000,
        maxDeliveries: MAX_DELIVERIES,
        maxInFlight: 100,
      })
    ).status,
    201,
  )
  t.equal((await call(broker.url, 'POST', '/v1/groups/g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (await call(broker.url, 'POST', '/v1/topics/a/messages', { messages: Array.from({ length: TOTAL }, (_, i) => ({ value: i })) })).status,
    201,
  )

  // Each round: every message pushed once more, then the broker killed at once.
  for (let round = 1; round <= MAX_DELIVERIES + 1; round++) {
    const expected = Math.min(round, MAX_DELIVERIES) * TOTAL
    if (round <= MAX_DELIVERIES) await waitUntil(() => pushes.length >= expected, 30_000, `round ${round}: every message pushed`)
    broker.child.kill('SIGKILL')
    t.equal(await broker.exited, 'SIGKILL')
    broker = await spawnBroker(env)
  }
  // After the last restart every message has had its maxDeliveries: each is dead-lettered, not pushed.
  await waitUntil(
    async () => (await call(broker.url, 'GET', '/v1/groups/g')).json.partitions[0].lag === 0,
    30_000,
    'every message dead-lettered after its last attempt',
  )

  const seen = new Map<number, number[]>()
  for (const p of pushes) seen.set(p.offset, [...(seen.get(p.offset) ?? []), p.attempt])
  t.equal(seen.size, TOTAL, 'every message was pushed')
  const repeats = [...seen].filter(([, attempts]) => new Set(attempts).size !== attempts.length)
  t.same(repeats, [], 'no message was pushed twice with one attempt number')
  const notIncreasing = [...seen].filter(([, attempts]) => attempts.some((a, i) => i > 0 && a <= attempts[i - 1]!))
  t.same(notIncreasing, [], 'attempt numbers increase in the order the pushes arrived')
  const over = [...seen].filter(([, attempts]) => attempts.length > MAX_DELIVERIES || attempts.some((a) => a > MAX_DELIVERIES))
  t.same(over, [], `no message pushed more than maxDeliveries (${MAX_DELIVERIES}) times`)
  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0)
})

/**
 * Exactly-once effects across a consumer process killed mid-message (SIGKILL, so nothing of it runs
 * after the signal): real consumer processes (exactly-once-child.ts) with PgIdempotencyStore, the
 * real broker, and the consumer's own PostgreSQL database. Killed after its COMMIT but before its
 * ack, the write stays and the redelivery, taken by a second process, is acked without running the
 * handler; killed after the handler's write but before the COMMIT, the write is gone and the
 * redelivery runs the handler. Either way the effect exists exactly once.
 */
import t from '../helpers/tap.ts'
import { unwrap } from '@hookq/client'
import { generateSecret } from '../../src/core/signature.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer, type TeardownHost } from '../helpers/db.ts'
import { consumerDatabase, sdkApi, spawnConsumer, type ConsumerProcess } from '../helpers/sdk.ts'
import { waitUntil } from '../helpers/wait.ts'

const { url } = await startListeningBroker(t)
const { hookq, setupWithConsumer, produceValues, partitions, lagZero, deliveriesWhen } = sdkApi(url)
// The embedded database takes one connection: the broker's, and none left for the consumers.
const server = { skip: needsServer }

/** Kills the process with SIGKILL and waits until it is gone. */
async function kill(p: ConsumerProcess): Promise<void> {
  p.child.kill('SIGKILL')
  await p.exited
}

/**
 * One message, consumer process `first` (paused at `pause`) takes it; once it says it reached the
 * pause it is killed, the group's consumer is pointed at a second process, and the message is
 * pushed to that one. Returns both processes and what the database held at the kill.
 */
async function killAt(tt: TeardownHost, group: string, pause: 'after-commit' | 'after-write') {
  const db = await consumerDatabase(tt, 'webhook_id text NOT NULL, value int NOT NULL, pid int NOT NULL', 2)
  const secret = generateSecret()
  const env = { HOOKQ_URL: url, HOOKQ_WEBHOOK_SECRET: secret, CONSUMER_DATABASE_URL: db.url }
  const child = 'test/sdk/exactly-once-child.ts'
  const [first, second] = await Promise.all([spawnConsumer(tt, child, { ...env, PAUSE: pause }), spawnConsumer(tt, child, env)])
  // Quick retries, and deliveries enough for any number of them.
  const quickRetry = { initialDelayMs: 100, maxDelayMs: 100, multiplier: 1, jitter: 0 }
  const consumerId = await setupWithConsumer(group, { maxDeliveries: 50, retry: quickRetry }, first.url, secret)
  await produceValues(group, [42])

  const said = pause === 'after-commit' ? 'committed' : 'wrote'
  const key = await waitUntil(() => new RegExp(`^${said} (\\S+)`, 'm').exec(first.output())?.[1], 30_000, `the first consumer's "${said}"`)
  const atKill = {
    effects: await db.rows('SELECT value, pid FROM effects'),
    handled: (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    lag: (await partitions(group))[0]!.lag,
  }
  await kill(first)
  await unwrap(hookq.PATCH('/v1/groups/{group}/consumers/{id}', { params: { path: { group, id: consumerId } }, body: { url: second.url } }))
  await lagZero(group, 60_000)
  // The attempt log is written in batches: wait for the acked attempt's row and its answer.
  const log = await deliveriesWhen(group, (d) => d.some((x) => x.outcome === 'acked' && x.statusCode !== null))
  return { db, first, second, key, atKill, acked: log.filter((x) => x.outcome === 'acked') }
}

t.test('killed after COMMIT, before the ack: the redelivery is acked without running the handler', server, async (t) => {
  const { db, first, second, key, atKill, acked } = await killAt(t, 'after-commit', 'after-commit')
  t.match(key, /^after-commit\/msg_\d+_0_0$/)
  t.same(atKill.effects, [{ value: 42, pid: first.child.pid }], 'at the kill: the write committed')
  t.same(atKill.handled, [key], 'and the id with it')
  t.equal(atKill.lag, 1, 'but not acked')

  t.same(
    await db.rows('SELECT value, pid FROM effects'),
    [{ value: 42, pid: first.child.pid }],
    "the effect exists exactly once: the first process's",
  )
  t.match(acked, [{ outcome: 'acked', statusCode: 200 }], 'the redelivery was acked (by the second process: the first was gone)')
  t.ok(acked[0]!.attempt >= 2, `as attempt ${acked[0]!.attempt}`)
  t.notMatch(second.output(), /^wrote /m, 'the second process acked it without running the handler')
  t.same(
    (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    [key],
  )
})

t.test("killed after the handler's write, before COMMIT: the write is gone and the redelivery runs the handler", server, async (t) => {
  const { db, first, second, key, atKill } = await killAt(t, 'after-write', 'after-write')
  t.same(atKill.effects, [], 'at the kill: the write is not visible (not committed)')
  t.same(atKill.handled, [], 'nor the id')

  t.same(
    await db.rows('SELECT value, pid FROM effects'),
    [{ value: 42, pid: second.child.pid }],
    "the effect exists exactly once: the second process's",
  )
  t.match(second.output(), new RegExp(`^wrote ${key} attempt [2-9]`, 'm'), 'the second process ran the handler for the redelivery')
  t.same(
    (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    [key],
  )
  t.match(first.output(), new RegExp(`^wrote ${key} attempt 1$`, 'm'))
})

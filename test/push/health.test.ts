/**
 * Consumer health in the group status (contract v1.1): last success, last failure with its error,
 * and the failure rate of recent pushes, from what the receiver answered.
 */
import t from '../helpers/tap.ts'
import { HealthRecorder } from '../../src/dispatch/health.ts'
import { nodeTimers } from '../../src/dispatch/schedule.ts'
import { recordHealth } from '../../src/store/consumer-health.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, groupStatus, allCompleted } = api(broker)

interface Health {
  lastSuccessAt: string | null
  lastFailureAt: string | null
  lastError: string | null
  recentFailureRate: number | null
}
const healthOf = async (group: string, id: string): Promise<Health> =>
  (await groupStatus(group)).consumers.find((c: { id: string }) => c.id === id).health

t.test('a consumer never pushed to has no health yet', async (t) => {
  t.equal((await call('PUT', '/v1/topics/h0', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/h0-g', { topic: 'h0' })).status, 201)
  const id = (await call('POST', '/v1/groups/h0-g/consumers', { url: 'http://127.0.0.1:9/x' })).json.id
  t.same(await healthOf('h0-g', id), { lastSuccessAt: null, lastFailureAt: null, lastError: null, recentFailureRate: null })
})

t.test('failures, then successes: times, the error and the rate follow what the consumer answered', async (t) => {
  let failing = true
  const receiver = await startReceiver(t, () => (failing ? { status: 500, body: 'database down' } : { status: 200 }))
  t.equal((await call('PUT', '/v1/topics/h1', { partitions: 1 })).status, 201)
  t.equal(
    (
      await call('PUT', '/v1/groups/h1-g', {
        topic: 'h1',
        ackMode: 'auto',
        maxDeliveries: 2,
        retry: { initialDelayMs: 10, maxDelayMs: 10, jitter: 0 },
      })
    ).status,
    201,
  )
  const id = (await call('POST', '/v1/groups/h1-g/consumers', { url: receiver.url })).json.id
  const before = Date.now()

  t.equal((await produce('h1', [{ value: 1 }, { value: 2 }])).status, 201)
  await allCompleted('h1-g', 20_000) // both dead-lettered after 2 attempts: 4 failed pushes
  const failed = await waitUntil(
    async () => {
      const h = await healthOf('h1-g', id)
      return h.lastFailureAt ? h : undefined
    },
    10_000,
    'failures recorded',
  )
  t.equal(failed.lastSuccessAt, null)
  t.ok(Date.parse(failed.lastFailureAt!) >= before - 5)
  t.equal(failed.lastError, 'HTTP 500: database down')
  t.equal(failed.recentFailureRate, 1, 'every push failed')

  failing = false
  t.equal((await produce('h1', [{ value: 3 }, { value: 4 }, { value: 5 }, { value: 6 }])).status, 201)
  await allCompleted('h1-g', 20_000)
  const healed = await waitUntil(
    async () => {
      const h = await healthOf('h1-g', id)
      return h.recentFailureRate !== null && h.recentFailureRate < 1 ? h : undefined
    },
    10_000,
    'successes recorded',
  )
  t.ok(Date.parse(healed.lastSuccessAt!) >= Date.parse(failed.lastFailureAt!), 'the last success is after the failures')
  t.equal(healed.lastFailureAt, failed.lastFailureAt, 'the last failure stays')
  t.equal(healed.lastError, 'HTTP 500: database down')
  t.equal(healed.recentFailureRate, 0.5, '4 of 8 pushes failed')
  t.equal(receiver.requests.length, 8)
})

t.test('no answer in time counts as a failure with its error', async (t) => {
  const receiver = await startReceiver(t, { hang: true })
  t.equal((await call('PUT', '/v1/topics/h2', { partitions: 1 })).status, 201)
  t.equal(
    (await call('PUT', '/v1/groups/h2-g', { topic: 'h2', ackMode: 'auto', pushTimeoutMs: 200, ackTimeoutMs: 1000, maxDeliveries: 1 }))
      .status,
    201,
  )
  const id = (await call('POST', '/v1/groups/h2-g/consumers', { url: receiver.url })).json.id
  t.equal((await produce('h2', [{ value: 1 }])).status, 201)
  const h = await waitUntil(
    async () => {
      const h = await healthOf('h2-g', id)
      return h.lastFailureAt ? h : undefined
    },
    10_000,
    'the timeout recorded',
  )
  t.equal(h.lastError, 'no answer within 200 ms')
  t.equal(h.recentFailureRate, 1)
})

t.test('a row PostgreSQL refuses loses only its own counts: the other consumers of the write are stored', async (t) => {
  t.equal((await call('PUT', '/v1/topics/h3', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/h3-g', { topic: 'h3' })).status, 201)
  const ids: string[] = []
  for (const n of [1, 2, 3]) ids.push((await call('POST', '/v1/groups/h3-g/consumers', { url: `http://127.0.0.1:9/${n}` })).json.id)
  const warnings: string[] = []
  const recorder = new HealthRecorder({
    db: broker.db,
    now: () => Date.now(),
    timers: nodeTimers,
    log: { warn: (_obj, msg) => warnings.push(msg) },
    // The real write, with the second consumer's bucket beyond what a timestamp holds (22008): a
    // row refused for its data, as one with NUL was before its text was made storable.
    write: (q, rows) =>
      recordHealth(
        q,
        rows.map((r) => (r.consumerId === ids[1] ? { ...r, bucketMs: 1e300 } : r)),
      ),
  })
  recorder.failure(ids[0]!, 'first')
  recorder.failure(ids[1]!, 'second')
  recorder.success(ids[2]!)
  await recorder.close()
  const [first, second, third] = [await healthOf('h3-g', ids[0]!), await healthOf('h3-g', ids[1]!), await healthOf('h3-g', ids[2]!)]
  t.match(first, { lastError: 'first', recentFailureRate: 1 })
  t.equal(second.lastFailureAt, null, 'the refused row is not stored')
  t.equal(third.recentFailureRate, 0)
  t.ok(third.lastSuccessAt)
  t.ok(warnings.length > 0, 'the refused row is reported')
})

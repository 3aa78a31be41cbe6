/**
 * Consumers and partitions against the real broker: assignment (partition p → enabled consumer
 * p mod n, in registration order), rebalancing when a consumer leaves or joins, pausing.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { env, pushGroups } from '../helpers/push-group.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus, allCompleted } = api(broker)
// The tests run side by side on the one broker: each has its own topic, group and receivers, and most
// of a test's time is a backoff or an absence window passing, which they need not take in turn.
t.jobs = 4
const { topicAndGroup, addConsumer, attemptRows } = pushGroups({ call, sql })
const owners = async (group: string) => (await groupStatus(group)).partitions.map((p: { consumerId: string | null }) => p.consumerId)
const ack = async (group: string, ids: string[]) =>
  (await call('POST', `/v1/groups/${group}/acks`, { deliveryIds: ids })).json.results.map((r: { status: string }) => r.status)
const partitionsOf = (r: { requests: Received[] }) => [...new Set(r.requests.map((x) => env(x).partition))].sort()

t.test('two consumers split four partitions: each receives exactly the partitions assigned to it', async (t) => {
  await topicAndGroup(t, 'split', { ackMode: 'auto' }, 4)
  const a = await startReceiver(t)
  const b = await startReceiver(t)
  const aId = await addConsumer('split-g', a.url)
  const bId = await addConsumer('split-g', b.url)
  t.same(await owners('split-g'), [aId, bId, aId, bId], 'p0 → a, p1 → b, p2 → a, p3 → b')
  await produce(
    'split',
    [0, 1, 2, 3].flatMap((p) => [0, 1, 2].map((i) => ({ value: `p${p}-${i}`, partition: p }))),
  )
  await allCompleted('split-g')
  t.same(partitionsOf(a), [0, 2])
  t.same(partitionsOf(b), [1, 3])
  t.equal(a.requests.length, 6)
  t.equal(b.requests.length, 6)
})

t.test('removing a consumer moves its partitions to the other; its in-flight and pending messages reach it', async (t) => {
  await topicAndGroup(t, 'move', { ackTimeoutMs: 4000, pushTimeoutMs: 1000, retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 } }, 4)
  const a = await startReceiver(t)
  const b = await startReceiver(t)
  const aId = await addConsumer('move-g', a.url)
  const bId = await addConsumer('move-g', b.url)
  await produce(
    'move',
    [0, 1, 2, 3].map((p) => ({ value: `first-${p}`, partition: p })),
  )
  await a.waitFor(2)
  await b.waitFor(2)
  t.same(partitionsOf(a), [0, 2])
  t.same(
    await ack(
      'move-g',
      b.requests.map((r) => env(r).deliveryId),
    ),
    ['acked', 'acked'],
  )
  // a answered 200 but never acks; then it is removed.
  t.equal((await call('DELETE', `/v1/groups/move-g/consumers/${aId}`)).status, 204)
  t.same(await owners('move-g'), [bId, bId, bId, bId], 'every partition now goes to b')
  await produce('move', [
    { value: 'second-0', partition: 0 },
    { value: 'second-2', partition: 2 },
  ])
  // b gets the two new ones and, after their ack deadline, the two that were out at a.
  const want = ['first-0', 'first-2', 'second-0', 'second-2']
  const acked = new Set<string>()
  await waitUntil(
    async () => {
      const fresh = b.requests.filter((r) => !acked.has(env(r).deliveryId) && want.includes(String(env(r).value)))
      for (const r of fresh) {
        acked.add(env(r).deliveryId)
        await ack('move-g', [env(r).deliveryId])
      }
      return (await groupStatus('move-g')).partitions.every((p: { lag: number }) => p.lag === 0)
    },
    30_000,
    "b acks everything that was a's",
  )
  t.same([...new Set(b.requests.map((r) => String(env(r).value)))].filter((v) => want.includes(v)).sort(), want)
  t.equal(a.requests.length, 2, 'the removed consumer got nothing more')
})

t.test('messages produced while a group has no consumer are pushed when one registers', async (t) => {
  await topicAndGroup(t, 'none', { ackMode: 'auto' }, 2)
  await produce('none', [
    { value: 'n0', partition: 0 },
    { value: 'n1', partition: 1 },
  ])
  // The status reads the committed offsets and the log's end: it holds as soon as produce answered.
  t.same(
    (await groupStatus('none-g')).partitions.map((p: { lag: number; consumerId: null }) => [p.lag, p.consumerId]),
    [
      [1, null],
      [1, null],
    ],
  )
  const r = await startReceiver(t)
  await addConsumer('none-g', r.url)
  await allCompleted('none-g')
  t.same(r.requests.map((x) => env(x).value).sort(), ['n0', 'n1'])
})

t.test('paused: no new pushes; acks of delivered messages still count; unpausing resumes', async (t) => {
  await topicAndGroup(t, 'pause', { ackTimeoutMs: 30_000 }, 1)
  const r = await startReceiver(t)
  await addConsumer('pause-g', r.url)
  await produce('pause', [{ value: 'before' }])
  await r.waitFor(1)
  t.equal((await call('PUT', '/v1/groups/pause-g', { topic: 'pause', paused: true })).json.paused, true)
  await produce('pause', [{ value: 'during-1' }, { value: 'during-2' }])
  await absenceWindow(700) // absence: unpaused, the two would go out at once
  t.equal(r.requests.length, 1, 'nothing pushed while paused')
  t.same(await ack('pause-g', [env(r.requests[0]).deliveryId]), ['acked'], 'an ack while paused')
  t.match((await groupStatus('pause-g')).partitions[0], { committedOffset: 1, endOffset: 3 }, 'the ack counted')
  await absenceWindow(600) // absence: unpaused, the freed slot would be filled at once
  t.equal(r.requests.length, 1, 'still nothing pushed after the ack freed a slot')
  const resumedAt = Date.now()
  t.equal((await call('PUT', '/v1/groups/pause-g', { topic: 'pause', paused: false })).json.paused, false)
  await r.waitFor(3)
  t.ok(Date.now() - resumedAt < 5000, 'resumed promptly')
  t.same(
    r.requests
      .slice(1)
      .map((x) => env(x).value)
      .sort(),
    ['during-1', 'during-2'],
    'both pushed (in parallel: in any order)',
  )
  t.same(
    await ack(
      'pause-g',
      r.requests.slice(1).map((x) => env(x).deliveryId),
    ),
    ['acked', 'acked'],
  )
})

t.test('paused while a message waits for its retry: the retry does not go out until unpaused', async (t) => {
  await topicAndGroup(t, 'pretry', { ackMode: 'auto', retry: { initialDelayMs: 300, maxDelayMs: 300, jitter: 0 } }, 1)
  // Attempt 1 is answered 500 only once the group is paused, so the retry is scheduled, and comes
  // due, while it is paused, however long the pause takes to apply.
  let pausedNow!: () => void
  const paused = new Promise<void>((resolve) => {
    pausedNow = resolve
  })
  const r = await startReceiver(t, (req) => (env(req).attempt === 1 ? { status: 500, after: paused } : { status: 200 }))
  await addConsumer('pretry-g', r.url)
  await produce('pretry', [{ value: 'x' }])
  await r.waitFor(1)
  const settings = { topic: 'pretry', ackMode: 'auto', retry: { initialDelayMs: 300, maxDelayMs: 300, jitter: 0 } }
  await call('PUT', '/v1/groups/pretry-g', { ...settings, paused: true })
  pausedNow()
  await waitUntil(
    async () => (await attemptRows('pretry-g')).some((row) => row.status_code === 500 && row.outcome === 'failed'),
    30_000,
    "attempt 1's 500 settled",
  )
  await absenceWindow(1000) // absence: the retry, due 300 ms after the 500, is held while paused
  t.equal(r.requests.length, 1, 'the retry came due while paused and was held')
  await call('PUT', '/v1/groups/pretry-g', { ...settings, paused: false })
  await allCompleted('pretry-g')
  t.equal(r.requests.length, 2)
  t.equal(env(r.requests[1]).attempt, 2)
})

t.test('a group created paused pushes nothing until unpaused', async (t) => {
  await topicAndGroup(t, 'cpause', { ackMode: 'auto', paused: true }, 2)
  const r = await startReceiver(t)
  await addConsumer('cpause-g', r.url)
  await produce('cpause', [
    { value: 1, partition: 0 },
    { value: 2, partition: 1 },
  ])
  await absenceWindow(700) // absence: unpaused, both would go out at once
  t.equal(r.requests.length, 0, 'nothing pushed while paused')
  await call('PUT', '/v1/groups/cpause-g', { topic: 'cpause', ackMode: 'auto', paused: false })
  await allCompleted('cpause-g')
  t.equal(r.requests.length, 2)
})

t.test("pausing with a partial PUT ({ topic, paused }) keeps the group's other settings", async (t) => {
  const settings = {
    ackMode: 'auto',
    ackTimeoutMs: 5000,
    maxDeliveries: 3,
    ordered: true,
    maxInFlight: 7,
    pushTimeoutMs: 2000,
    pushFormat: 'raw',
    retry: { initialDelayMs: 50, multiplier: 3, maxDelayMs: 500, jitter: 0 },
  }
  await topicAndGroup(t, 'keep', settings, 1)
  const paused = (await call('PUT', '/v1/groups/keep-g', { topic: 'keep', paused: true })).json
  t.match(paused, { ...settings, paused: true }, 'only paused changed')
  const r = await startReceiver(t)
  await addConsumer('keep-g', r.url)
  await produce('keep', [{ value: 'k' }])
  const resumed = (await call('PUT', '/v1/groups/keep-g', { topic: 'keep', paused: false })).json
  t.match(resumed, { ...settings, paused: false }, 'only paused changed back')
  await r.waitFor(1)
  t.equal(r.requests[0]!.body, '"k"', 'still pushed raw')
  // Still auto-acked: the 200 completes it without an ack call.
  await waitUntil(async () => (await groupStatus('keep-g')).partitions[0].lag === 0, 30_000, 'auto ack completed it').then(
    () => t.pass('completed by the 200'),
    (err: Error) => t.fail(err.message),
  )
})

t.test('assignment follows registration order (p → consumer p mod n), also when registered back to back', async (t) => {
  await topicAndGroup(t, 'order', { ackMode: 'auto', paused: true }, 12)
  const r = await startReceiver(t)
  const ids: string[] = []
  for (let i = 0; i < 12; i++) ids.push(await addConsumer('order-g', `${r.url}/c${i}`))
  t.same(await owners('order-g'), ids, 'partition i → the i-th registered consumer')
  const listed = (await call('GET', '/v1/groups/order-g/consumers')).json.consumers.map((c: { id: string }) => c.id)
  t.same(listed, ids, 'consumers listed in registration order')
  // Remove the third: partitions p → remaining[p mod 11].
  t.equal((await call('DELETE', `/v1/groups/order-g/consumers/${ids[2]}`)).status, 204)
  const rest = ids.filter((_, i) => i !== 2)
  t.same(
    await owners('order-g'),
    Array.from({ length: 12 }, (_, p) => rest[p % rest.length]),
  )
})

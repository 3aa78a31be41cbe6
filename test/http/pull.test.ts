/**
 * Pull delivery on one broker process (contract "Pull delivery"): leases are attempts like pushes
 * (expiry → the next attempt, nack, extend, maxDeliveries → dead letter, the deliveries log),
 * ordering across callers, long polls woken by a produce, a caller that goes away, 409s and bad input.
 */
import t from '../helpers/tap.ts'
import { request } from 'undici'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

interface Pulled {
  deliveryId: string
  topic: string
  group: string
  partition: number
  offset: number
  key: string | null
  value: unknown
  attempt: number
  ackDeadline: string
  traceparent: string
  tracestate: string
}

const { broker, url } = await startListeningBroker(t)
const call = async (method: string, path: string, payload?: unknown) => {
  const res = await broker.app.inject({
    method: method as 'GET',
    url: path,
    ...(payload === undefined ? {} : { payload: payload as object }),
  })
  return { status: res.statusCode, json: res.body === '' ? undefined : res.json() }
}
const pull = async (group: string, body: Record<string, unknown> = {}): Promise<Pulled[]> => {
  const res = await call('POST', `/v1/groups/${group}/pull`, body)
  if (res.status !== 200) throw new Error(`pull ${res.status}: ${JSON.stringify(res.json)}`)
  return (res.json as { messages: Pulled[] }).messages
}
const produce = (topic: string, messages: unknown[]) => call('POST', `/v1/topics/${topic}/messages`, { messages })
/** Pulls (without waiting) until `n` messages came in all, or fails after the limit. */
const pullUntil = async (group: string, n: number, body: Record<string, unknown> = {}): Promise<Pulled[]> => {
  const got: Pulled[] = []
  await waitUntil(
    async () => {
      got.push(...(await pull(group, body)))
      return got.length >= n
    },
    20_000,
    `${n} messages pulled from ${group}`,
  )
  return got
}

await call('PUT', '/v1/topics/jobs', { partitions: 2 })
await call('PUT', '/v1/topics/jobs-dlq', { partitions: 1 })

t.test('a push group refuses pull (409 push_group), a pull group refuses consumers (409 pull_group)', async (t) => {
  await call('PUT', '/v1/groups/pusher', { topic: 'jobs' })
  const a = await call('POST', '/v1/groups/pusher/pull', {})
  t.equal(a.status, 409)
  t.equal((a.json as { code: string }).code, 'push_group')
  const made = await call('PUT', '/v1/groups/taker409', { topic: 'jobs', delivery: 'pull' })
  t.equal((made.json as { delivery: string }).delivery, 'pull')
  const b = await call('POST', '/v1/groups/taker409/consumers', { url: 'http://127.0.0.1:9/x' })
  t.equal(b.status, 409)
  t.equal((b.json as { code: string }).code, 'pull_group')
  t.equal((await call('POST', '/v1/groups/nope/pull', {})).status, 404)
})

t.test('a pull with no body at all takes the defaults (every field is optional)', async (t) => {
  await call('PUT', '/v1/topics/bare', { partitions: 1 })
  await call('PUT', '/v1/groups/bare', { topic: 'bare', delivery: 'pull' })
  await produce('bare', [{ value: 'b' }])
  // Without waitMs a pull answers at once, maybe before the broker has read the new message: repeat.
  const got: Pulled[] = []
  await waitUntil(
    async () => {
      const res = await request(`${url}/v1/groups/bare/pull`, { method: 'POST' })
      const body = (await res.body.json()) as { messages: Pulled[] }
      t.equal(res.statusCode, 200, JSON.stringify(body))
      got.push(...body.messages)
      return got.length > 0
    },
    20_000,
    'the message pulled with a bare POST',
  )
  t.same(
    got.map((m) => [m.value, m.attempt]),
    [['b', 1]],
  )
})

t.test('bad input is 400 problem details and leases nothing', async (t) => {
  await call('PUT', '/v1/topics/bad', { partitions: 1 })
  await call('PUT', '/v1/groups/bad', { topic: 'bad', delivery: 'pull' })
  await produce('bad', [{ value: 1 }])
  for (const body of [
    { maxMessages: 0 },
    { maxMessages: 1001 },
    { waitMs: 20_001 },
    { leaseMs: 999 },
    { maxMessages: 'x' },
    { extra: 1 },
  ]) {
    const res = await broker.app.inject({ method: 'POST', url: '/v1/groups/bad/pull', payload: body })
    t.equal(res.statusCode, 400, JSON.stringify(body))
    t.match(res.headers['content-type'], /application\/problem\+json/)
  }
  const got = await pullUntil('bad', 1)
  t.equal(got[0]!.attempt, 1, 'the message was never leased by the refused calls')
})

t.test('a lease that passes is a failed attempt: the next pull gets attempt 2; nack and extend act on leases', async (t) => {
  await call('PUT', '/v1/groups/lease', {
    topic: 'jobs',
    delivery: 'pull',
    startAt: 'latest',
    maxDeliveries: 3,
    deadLetterTopic: 'jobs-dlq',
    retry: { initialDelayMs: 0, multiplier: 1, maxDelayMs: 0, jitter: 0 },
  })
  await produce('jobs', [
    { value: 'expire', partition: 0, headers: { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' } },
  ])
  const [first] = await pullUntil('lease', 1, { leaseMs: 1000 })
  t.equal(first!.attempt, 1)
  t.equal(first!.value, 'expire')
  t.match(first!.traceparent, /^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$/, 'the message trace, a span of its own')
  t.not(first!.traceparent, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
  // Not acked: after its lease (1 s) it comes back as attempt 2.
  const [second] = await pullUntil('lease', 1, { leaseMs: 60_000 })
  t.equal(second!.offset, first!.offset)
  t.equal(second!.attempt, 2)
  t.not(second!.deliveryId, first!.deliveryId)
  // The first lease's ack is still taken (a late ack of any attempt completes the message)... but nack this one instead.
  const nack = await call('POST', '/v1/groups/lease/nacks', { deliveryIds: [second!.deliveryId] })
  t.same((nack.json as { results: unknown[] }).results, [{ deliveryId: second!.deliveryId, status: 'nacked' }])
  const [third] = await pullUntil('lease', 1, { leaseMs: 1000 })
  t.equal(third!.attempt, 3)
  const ext = await call('POST', '/v1/groups/lease/extend', { deliveryIds: [third!.deliveryId], extendMs: 120_000 })
  t.same((ext.json as { results: unknown[] }).results, [{ deliveryId: third!.deliveryId, status: 'extended' }])
  // Extended past its 1 s lease: nothing comes back meanwhile. Then a nack at maxDeliveries 3 dead-letters it.
  t.same(await pull('lease', { waitMs: 2500 }), [], 'the extended lease holds the message')
  await call('POST', '/v1/groups/lease/nacks', { deliveryIds: [third!.deliveryId] })
  const dead = await waitUntil(
    async () => {
      const res = await call('GET', '/v1/topics/jobs-dlq/partitions/0/messages?limit=10')
      return (res.json as { messages: { value: unknown; headers: Record<string, string> }[] }).messages.find((m) => m.value === 'expire')
    },
    20_000,
    'the dead letter',
  )
  t.equal(dead.headers['hookq-dlq-group'], 'lease')
  t.equal(dead.headers['hookq-dlq-attempts'], '3')
  const log = await call('GET', '/v1/groups/lease/deliveries?limit=100')
  const outcomes = (log.json as { deliveries: { attempt: number; outcome: string; consumerId: string | null }[] }).deliveries
    .sort((a, b) => a.attempt - b.attempt)
    .map((d) => [d.attempt, d.outcome, d.consumerId])
  t.same(outcomes, [
    [1, 'timed_out', null],
    [2, 'nacked', null],
    [3, 'dead', null],
  ])
})

t.test('acked leases complete; ordering "partition" holds across callers', async (t) => {
  await call('PUT', '/v1/topics/ordered', { partitions: 1 })
  await call('PUT', '/v1/groups/ordered', { topic: 'ordered', delivery: 'pull', ordering: 'partition' })
  await produce('ordered', [{ value: 1 }, { value: 2 }, { value: 3 }])
  const [a] = await pullUntil('ordered', 1)
  t.equal(a!.value, 1)
  // A second caller gets nothing while the first one's lease is outstanding.
  t.same(await pull('ordered', { maxMessages: 10 }), [])
  const waiting = pull('ordered', { waitMs: 15_000 })
  await call('POST', '/v1/groups/ordered/acks', { deliveryIds: [a!.deliveryId] })
  const [b] = await waiting
  t.equal(b!.value, 2, 'the ack freed the partition: the waiting caller got the next message')
  await call('POST', '/v1/groups/ordered/acks', { deliveryIds: [b!.deliveryId] })
  const [c] = await pullUntil('ordered', 1)
  t.equal(c!.value, 3)
  t.equal(c!.attempt, 1)
})

t.test('maxMessages bounds an answer; maxInFlight bounds the leases of a partition', async (t) => {
  await call('PUT', '/v1/topics/many', { partitions: 1 })
  await call('PUT', '/v1/groups/many', { topic: 'many', delivery: 'pull', maxInFlight: 5 })
  await produce(
    'many',
    Array.from({ length: 20 }, (_, i) => ({ value: i })),
  )
  const leased: Pulled[] = []
  await waitUntil(
    async () => {
      const got = await pull('many', { maxMessages: 3 })
      t.ok(got.length <= 3, 'maxMessages 3')
      leased.push(...got)
      return leased.length >= 5
    },
    20_000,
    'five leases',
  )
  t.same(
    leased.map((m) => m.offset).sort((x, y) => x - y),
    [0, 1, 2, 3, 4],
    'maxInFlight 5: five leased, in offset order',
  )
  t.same(await pull('many', { maxMessages: 100 }), [], 'no more while five are leased')
  await call('POST', '/v1/groups/many/acks', { deliveryIds: [leased[0]!.deliveryId] })
  const next = await pull('many', { maxMessages: 100, waitMs: 15_000 })
  t.same(
    next.map((m) => m.offset),
    [5],
    'an ack frees one lease',
  )
})

t.test('a long poll is woken by a produce', async (t) => {
  await call('PUT', '/v1/topics/poll', { partitions: 4 })
  await call('PUT', '/v1/groups/poll', { topic: 'poll', delivery: 'pull' })
  // Several callers waiting at once; the produce wakes one of them with the message.
  const waits = [1, 2, 3].map(() => pull('poll', { waitMs: 20_000, maxMessages: 1 }))
  await waitUntil(() => broker.cluster.pullWaiters('poll') === 3, 20_000, 'three callers waiting')
  await produce('poll', [{ value: 'wake', partition: 2 }])
  const first = await Promise.race(waits)
  t.equal(first.length, 1)
  t.equal(first[0]!.value, 'wake')
  t.equal(first[0]!.partition, 2)
  // The two others are woken by the next produce, one message each (maxMessages 1).
  await produce('poll', [
    { value: 'a', partition: 0 },
    { value: 'b', partition: 1 },
  ])
  const all = (await Promise.all(waits)).map((m) => m.length)
  t.same(all, [1, 1, 1], 'every waiting caller answered with one message')
})

t.test('a caller that goes away leases nothing more', async (t) => {
  await call('PUT', '/v1/topics/gone', { partitions: 1 })
  await call('PUT', '/v1/groups/gone', { topic: 'gone', delivery: 'pull' })
  const ac = new AbortController()
  const going = request(`${url}/v1/groups/gone/pull`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ waitMs: 20_000 }),
    signal: ac.signal,
  }).catch((err: unknown) => err)
  // Wait until the broker has the caller waiting, then cut the connection.
  await waitUntil(() => broker.cluster.pullWaiters('gone') === 1, 20_000, 'the caller to wait')
  ac.abort()
  await going
  await waitUntil(() => broker.cluster.pullWaiters('gone') === 0, 20_000, 'the caller to leave')
  await produce('gone', [{ value: 'kept' }])
  const [m] = await pullUntil('gone', 1)
  t.equal(m!.value, 'kept')
  t.equal(m!.attempt, 1, 'not leased to the caller that went away')
})

t.test('a caller gone while its answer was made: its leases are not spent, the next caller gets them at once as attempt 1', async (t) => {
  await call('PUT', '/v1/topics/left', { partitions: 1 })
  await call('PUT', '/v1/groups/left', { topic: 'left', delivery: 'pull', ackTimeoutMs: 120_000 })
  await produce('left', [{ value: 'x' }, { value: 'y' }])
  // The caller goes away just after this process leased for it and before its answer was sent
  // (the connection closing at that moment): seen by the service as its signal aborted then.
  const cluster = broker.cluster
  const pullHere = cluster.pull.bind(cluster)
  const gone = new AbortController()
  let leased = 0
  cluster.pull = async (group, opts, signal) => {
    const got = await pullHere(group, opts, signal)
    leased += got.length
    if (got.length > 0) gone.abort()
    return got
  }
  t.teardown(() => {
    cluster.pull = pullHere
  })
  await waitUntil(
    async () =>
      (await broker.services.acks.pull('left', { maxMessages: 10, waitMs: 1000, leaseMs: undefined }, gone.signal)).length === 0 &&
      leased > 0,
    30_000,
    'a pull that leased for a caller gone',
  )
  cluster.pull = pullHere
  // Not waiting out a 120 s lease: leasable again at once, and with the same attempt number.
  const again = await pullUntil('left', leased, { maxMessages: 10 })
  t.same(
    again.map((m) => [m.value, m.attempt]).slice(0, leased),
    [
      ['x', 1],
      ['y', 1],
    ].slice(0, leased),
  )
  // Acked, the attempts are written: only the leases received are on record.
  await call('POST', '/v1/groups/left/acks', { deliveryIds: again.map((m) => m.deliveryId) })
  let outcomes: string[] = []
  await waitUntil(
    async () => {
      const log = await call('GET', '/v1/groups/left/deliveries')
      outcomes = (log.json as { deliveries: { outcome: string }[] }).deliveries.map((d) => d.outcome)
      return outcomes.length >= again.length && outcomes.every((o) => o === 'acked')
    },
    30_000,
    'the attempts written',
  )
  t.same(
    outcomes,
    again.map(() => 'acked'),
    'no attempt recorded for the leases never received',
  )
})

t.test('one-message pulls of a backlog on two partitions are served from both: neither is starved', async (t) => {
  await call('PUT', '/v1/topics/turns', { partitions: 2 })
  await call('PUT', '/v1/groups/turns', { topic: 'turns', delivery: 'pull', ackTimeoutMs: 120_000 })
  // A backlog on partition 0 and on partition 1; each caller takes one message.
  await produce(
    'turns',
    [0, 1, 2, 3].flatMap((i) => [0, 1].map((partition) => ({ value: `p${partition}-${i}`, partition }))),
  )
  const answers: number[] = []
  await waitUntil(
    async () => {
      const got = await pull('turns', { maxMessages: 1 })
      if (got.length > 0) answers.push(got[0]!.partition)
      return answers.length >= 6
    },
    30_000,
    'six one-message answers',
  )
  // The first two may come as the partitions' reads end; after them both partitions serve. (This
  // holds with each caller starting at the next partition, PushFlow.pullerCame, and also without
  // it, since reads ahead alternate the partitions: it does not prove the rotation itself.)
  const of = (p: number) => answers.slice(2).filter((x) => x === p).length
  t.same([of(0), of(1)], [2, 2], `both partitions served (${answers.join(',')})`)
})

t.test('filters and seek hold for pull groups', async (t) => {
  await call('PUT', '/v1/topics/filtered', { partitions: 1 })
  await call('PUT', '/v1/groups/filtered', { topic: 'filtered', delivery: 'pull', filter: { 'headers.kind': 'keep' } })
  await produce('filtered', [
    { value: 'drop', headers: { kind: 'other' } },
    { value: 'keep', headers: { kind: 'keep' } },
  ])
  const [m] = await pullUntil('filtered', 1)
  t.equal(m!.value, 'keep', 'the filter skipped the other message')
  await call('POST', '/v1/groups/filtered/acks', { deliveryIds: [m!.deliveryId] })
  // A seek back to 0: the kept message is leased again (attempt 1 of a new round), the old id is void.
  const seek = await call('POST', '/v1/groups/filtered/seek', { offset: 0 })
  t.equal(seek.status, 200, JSON.stringify(seek.json))
  const [again] = await pullUntil('filtered', 1)
  t.equal(again!.value, 'keep')
  t.equal(again!.offset, m!.offset)
  t.not(again!.deliveryId, m!.deliveryId)
  const stale = await call('POST', '/v1/groups/filtered/acks', { deliveryIds: [m!.deliveryId] })
  t.equal((stale.json as { results: { status: string }[] }).results[0]!.status, 'unknown', 'an id from before the seek no longer counts')
})

t.test('ordering "key": one outstanding message per key across callers', async (t) => {
  await call('PUT', '/v1/topics/keyed', { partitions: 1 })
  await call('PUT', '/v1/groups/keyed', { topic: 'keyed', delivery: 'pull', ordering: 'key' })
  await produce('keyed', [
    { key: 'k1', value: 'k1-a' },
    { key: 'k1', value: 'k1-b' },
    { key: 'k2', value: 'k2-a' },
  ])
  const first = await pullUntil('keyed', 2, { maxMessages: 10 })
  t.same(first.map((m) => m.value).sort(), ['k1-a', 'k2-a'], 'k1-b waits behind k1-a')
  t.same(await pull('keyed', { maxMessages: 10 }), [], 'a second caller gets nothing of a busy key')
  const waiting = pull('keyed', { maxMessages: 10, waitMs: 15_000 })
  await call('POST', '/v1/groups/keyed/acks', { deliveryIds: [first.find((m) => m.value === 'k1-a')!.deliveryId] })
  t.same(
    (await waiting).map((m) => m.value),
    ['k1-b'],
    "the ack of k1-a frees k1's next message, for the caller waiting",
  )
})

t.test('a pull of fresh messages answers with all it can lease, not with the first alone', async (t) => {
  // None reserved yet (a first lease needs the partition's reservation written): the messages the
  // pull admits are reserved in one write and all answered, not the first alone while the others
  // wait for a second write.
  await call('PUT', '/v1/topics/fresh', { partitions: 1 })
  await call('PUT', '/v1/groups/fresh', { topic: 'fresh', delivery: 'pull' })
  await produce(
    'fresh',
    Array.from({ length: 30 }, (_, i) => ({ value: i })),
  )
  const got = await pull('fresh', { maxMessages: 30, waitMs: 10_000 })
  t.same(
    got.map((m) => m.value),
    Array.from({ length: 30 }, (_, i) => i),
    'all 30 in the one answer',
  )
  await call('POST', '/v1/groups/fresh/acks', { deliveryIds: got.map((m) => m.deliveryId) })
})

t.test('a pull reserves no more first attempts than its callers can take', async (t) => {
  // A reservation (group_offsets.pushed_offset) past what was leased would have the next owner,
  // after a crash, count an attempt for messages never leased: dead-lettered at maxDeliveries 1.
  await call('PUT', '/v1/topics/room', { partitions: 1 })
  await call('PUT', '/v1/groups/room', { topic: 'room', delivery: 'pull', maxDeliveries: 1, ackTimeoutMs: 120_000 })
  await produce(
    'room',
    Array.from({ length: 10 }, (_, i) => ({ value: i })),
  )
  const [first] = await pull('room', { maxMessages: 1, waitMs: 10_000 })
  t.equal(first!.value, 0)
  const reserved = async () =>
    (
      await broker.db.pool.query<{ pushed: number }>(
        `SELECT o.pushed_offset::int AS pushed FROM group_offsets o JOIN consumer_groups g ON g.id = o.group_id WHERE g.name = 'room'`,
      )
    ).rows[0]!.pushed
  t.equal(await reserved(), 1, 'reserved up to the one message leased')
  const rest = await pull('room', { maxMessages: 3, waitMs: 10_000 })
  t.same(
    rest.map((m) => m.value),
    [1, 2, 3],
  )
  t.equal(await reserved(), 4)
  await call('POST', '/v1/groups/room/acks', { deliveryIds: [first!, ...rest].map((m) => m.deliveryId) })
})

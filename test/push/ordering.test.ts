/**
 * Ordering and flow control against the real broker: ordered groups keep strict per-partition
 * order through failures, nacks and explicit acks; maxInFlight bounds what is out per partition.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { addConsumer, env, topicAndGroup, type TT } from '../helpers/push-group.ts'
import { startReceiver, type BehaviourSpec, type Received } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, groupStatus, allCompleted, ack } = api(broker)
// The tests run side by side on the one broker: each has its own topic, group and receivers, and most
// of a test's time is a backoff or an absence window passing, which they need not take in turn.
t.jobs = 4

async function setup(
  tt: TT,
  name: string,
  group: object,
  partitions: number,
  behave: (req: Received) => BehaviourSpec = () => ({ status: 200 }),
) {
  await topicAndGroup(call, tt, name, group, partitions)
  // Concurrency seen by the receiver: requests whose answer has not gone out yet when one arrives.
  let maxOpen = 0
  const receiver = await startReceiver(tt, (req) => {
    const open = receiver.requests.filter((r) => !r.closed && r !== req && env(r).partition === env(req).partition).length + 1
    if (open > maxOpen) maxOpen = open
    return behave(req)
  })
  await addConsumer(call, `${name}-g`, receiver.url)
  return { receiver, maxOpen: () => maxOpen }
}

t.test('ordered: a message failing twice holds back the rest of its partition; order of first successes is offset order', async (t) => {
  const failures = new Map<string, number>()
  const { receiver, maxOpen } = await setup(
    t,
    'ord',
    {
      ackMode: 'auto',
      ordered: true,
      maxDeliveries: 5,
      retry: { initialDelayMs: 100, multiplier: 1, maxDelayMs: 100, jitter: 0 },
    },
    1,
    (req) => {
      const v = String(env(req).value)
      const n = (failures.get(v) ?? 0) + 1
      failures.set(v, n)
      // m1 and m4 fail twice, then succeed; a 30 ms answer gives overlapping pushes a chance to show.
      return (v === 'm1' || v === 'm4') && n <= 2 ? { status: 500, delayMs: 30 } : { status: 200, delayMs: 30 }
    },
  )
  await produce(
    'ord',
    Array.from({ length: 7 }, (_, i) => ({ value: `m${i}`, partition: 0 })),
  )
  await allCompleted('ord-g')
  const offsets = receiver.requests.map((r) => env(r).offset)
  t.same(offsets, [0, 1, 1, 1, 2, 3, 4, 4, 4, 5, 6], 'pushes in strict offset order, retries included')
  const firstSuccess = receiver.requests
    .filter((r) => {
      const v = String(env(r).value)
      return !((v === 'm1' || v === 'm4') && env(r).attempt <= 2)
    })
    .map((r) => env(r).offset)
  t.same(firstSuccess, [0, 1, 2, 3, 4, 5, 6], 'first successful deliveries in offset order')
  t.equal(maxOpen(), 1, 'never two pushes of the partition at once')
})

t.test('ordered is per partition: a failing partition does not hold back another', async (t) => {
  // Partition 0's offsets seen when partition 1's last message arrived (taken in the handler, so
  // no retry of partition 0 can slip in between).
  let p0WhenP1Done: number[] | undefined
  const { receiver } = await setup(
    t,
    'ordp',
    {
      ackMode: 'auto',
      ordered: true,
      maxDeliveries: 1000,
      retry: { initialDelayMs: 200, multiplier: 1, maxDelayMs: 200, jitter: 0 },
    },
    2,
    // Partition 0's first message fails twice, and then for as long as partition 1 is not all
    // delivered (a state, not a time: on a slow machine its retries would otherwise run out first).
    (req) => {
      const p1 = receiver.requests.filter((r) => env(r).partition === 1).length
      if (env(req).partition === 1 && p1 === 5)
        p0WhenP1Done = receiver.requests.filter((r) => env(r).partition === 0).map((r) => env(r).offset)
      const failing = env(req).partition === 0 && env(req).offset === 0
      return failing && (env(req).attempt <= 2 || p1 < 5) ? { status: 500 } : { status: 200 }
    },
  )
  // Partition 0 first, and partition 1 only once partition 0 is failing: partition 1's messages
  // then go out while partition 0 is held on its first message, whatever the machine's load.
  await produce(
    'ordp',
    Array.from({ length: 3 }, (_, i) => ({ value: `a${i}`, partition: 0 })),
  )
  await waitUntil(() => receiver.requests.some((r) => env(r).partition === 0), 30_000, 'partition 0 pushed')
  await produce(
    'ordp',
    Array.from({ length: 5 }, (_, i) => ({ value: `b${i}`, partition: 1 })),
  )
  await waitUntil(() => p0WhenP1Done !== undefined, 30_000, 'partition 1 delivered')
  t.ok(
    p0WhenP1Done!.length >= 1 && p0WhenP1Done!.every((o) => o === 0),
    `partition 0 still on its first message when partition 1 was done (offsets ${JSON.stringify(p0WhenP1Done)})`,
  )
  await allCompleted('ordp-g')
  const p0Offsets = receiver.requests.filter((r) => env(r).partition === 0).map((r) => env(r).offset)
  const retries = p0Offsets.filter((o) => o === 0).length
  t.ok(retries >= 3, `offset 0 pushed ${retries} times: failed at least twice, then delivered`)
  t.same(p0Offsets, [...Array(retries).fill(0), 1, 2], 'then offsets 1 and 2, in order, once each')
})

t.test('ordered, explicit acks: the next message waits for the ack; a nack re-pushes the same message first', async (t) => {
  const { receiver } = await setup(
    t,
    'orde',
    { ackTimeoutMs: 30_000, ordered: true, retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 } },
    1,
  )
  await produce('orde', [{ value: 'e0' }, { value: 'e1' }, { value: 'e2' }])
  await receiver.waitFor(1)
  await absenceWindow(600) // absence: unordered, offsets 1 and 2 would go out at once
  t.equal(receiver.requests.length, 1, 'answered 200 but not acked: nothing else of the partition is pushed')
  t.same(await ack('orde-g', [env(receiver.requests[0]).deliveryId]), ['acked'])
  await receiver.waitFor(2)
  t.equal(env(receiver.requests[1]).offset, 1)
  const nacked = await call('POST', '/v1/groups/orde-g/nacks', { deliveryIds: [env(receiver.requests[1]).deliveryId], delayMs: 200 })
  t.equal(nacked.json.results[0].status, 'nacked')
  await receiver.waitFor(3)
  t.match(env(receiver.requests[2]), { offset: 1, attempt: 2 }, 'the nacked message again, before offset 2')
  await absenceWindow(600) // absence: offset 2 waits for the ack of offset 1
  t.equal(receiver.requests.length, 3, 'offset 2 not pushed while offset 1 is out')
  t.same(await ack('orde-g', [env(receiver.requests[2]).deliveryId]), ['acked'])
  await receiver.waitFor(4)
  t.equal(env(receiver.requests[3]).offset, 2)
  t.same(await ack('orde-g', [env(receiver.requests[3]).deliveryId]), ['acked'])
  t.match((await groupStatus('orde-g')).partitions[0], { committedOffset: 3, inFlight: 0 })
})

t.test('maxInFlight: with explicit acks and none sent, at most maxInFlight messages of a partition are out', async (t) => {
  const { receiver } = await setup(t, 'mif', { ackTimeoutMs: 30_000, maxInFlight: 3 }, 2)
  await produce('mif', [
    ...Array.from({ length: 8 }, (_, i) => ({ value: `a${i}`, partition: 0 })),
    ...Array.from({ length: 8 }, (_, i) => ({ value: `b${i}`, partition: 1 })),
  ])
  await receiver.waitFor(6)
  await absenceWindow(600) // absence: with no ack, no fourth message of a partition may go out
  // Which offsets went out, not in what order they arrived: the pushes of an unordered partition
  // run in parallel, on connections of their own (a CI run once saw offset 1 arrive before 0).
  const part = (p: number) =>
    receiver.requests
      .filter((r) => env(r).partition === p)
      .map((r) => env(r).offset)
      .sort((a, b) => a - b)
  t.same(part(0), [0, 1, 2], 'partition 0: three out')
  t.same(part(1), [0, 1, 2], 'partition 1: three out (the limit is per partition)')
  t.same(
    (await groupStatus('mif-g')).partitions.map((p: { inFlight: number }) => p.inFlight),
    [3, 3],
  )

  // Ack one in the middle on partition 0: exactly one more goes out there, none on partition 1.
  const p0 = receiver.requests.filter((r) => env(r).partition === 0)
  t.same(await ack('mif-g', [env(p0[1]).deliveryId]), ['acked'])
  await receiver.waitFor(7)
  await absenceWindow(600) // absence: one slot was freed, so one more push and no other
  t.same(part(0), [0, 1, 2, 3], 'one slot freed, one more pushed')
  t.same(part(1), [0, 1, 2])

  // Ack the oldest unacked message of each partition, round after round; after each round the
  // freed slots fill again: each partition has exactly min(3, what is left of its 8) out. At no
  // point are more than 3 of a partition pushed and unacked.
  const acked = new Set<string>([env(p0[1]).deliveryId])
  const pushed = (p: number) => receiver.requests.filter((r) => env(r).partition === p)
  const unacked = (p: number) => pushed(p).filter((r) => !acked.has(env(r).deliveryId))
  let maxOut = 0
  while (acked.size < 16) {
    for (const p of [0, 1]) {
      const out = unacked(p)
      maxOut = Math.max(maxOut, out.length)
      if (out[0]) {
        acked.add(env(out[0]).deliveryId)
        t.same(await ack('mif-g', [env(out[0]).deliveryId]), ['acked'], `partition ${p} offset ${env(out[0]).offset} acked`)
      }
    }
    await waitUntil(
      () => [0, 1].every((p) => unacked(p).length === Math.min(3, 8 - (pushed(p).length - unacked(p).length))),
      30_000,
      'the freed slots filled again',
    )
  }
  t.equal(acked.size, 16, 'every message pushed and acked')
  t.ok(maxOut <= 3, `at most 3 unacked of a partition at any time (saw ${maxOut})`)
  await allCompleted('mif-g')
  t.equal(receiver.requests.length, 16, 'each message pushed once')
})

t.test('ordered: a dead-lettered message releases its partition; a delayed one holds it back', async (t) => {
  const arrived = new Map<string, number>()
  const { receiver } = await setup(
    t,
    'ordd',
    {
      ackMode: 'auto',
      ordered: true,
      maxDeliveries: 2,
      retry: { initialDelayMs: 50, maxDelayMs: 50, jitter: 0 },
    },
    1,
    (req) => {
      if (!arrived.has(String(env(req).value))) arrived.set(String(env(req).value), Date.now())
      return env(req).value === 'poison' ? { status: 500 } : { status: 200 }
    },
  )
  const before = Date.now()
  await produce('ordd', [{ value: 'poison' }, { value: 'late', delayMs: 800 }, { value: 'after' }])
  await allCompleted('ordd-g')
  t.same(
    receiver.requests.map((r) => env(r).value),
    ['poison', 'poison', 'late', 'after'],
    'dead letter, then the delayed one, then the rest',
  )
  t.ok(arrived.get('late')! - before >= 800, `the delayed message went out after its delay (${arrived.get('late')! - before} ms)`)
  t.ok(arrived.get('after')! >= arrived.get('late')!, 'the next one only after it')
})

t.test('raising maxInFlight at runtime lets more out at once; ordered: true then holds back new pushes', async (t) => {
  const settings = { ackTimeoutMs: 30_000, maxInFlight: 2 }
  const { receiver } = await setup(t, 'mifu', settings, 1)
  await produce(
    'mifu',
    Array.from({ length: 10 }, (_, i) => ({ value: i })),
  )
  await receiver.waitFor(2)
  await absenceWindow(600) // absence: maxInFlight 2, no ack
  t.equal(receiver.requests.length, 2)
  t.equal((await call('PUT', '/v1/groups/mifu-g', { topic: 'mifu', ...settings, maxInFlight: 5 })).status, 200)
  await receiver.waitFor(5)
  await absenceWindow(600) // absence: maxInFlight 5 now, still no ack
  t.same(
    receiver.requests.map((r) => env(r).offset).sort((a, b) => a - b),
    [0, 1, 2, 3, 4],
    'three more went out (in any order: they run in parallel)',
  )
  t.equal((await call('PUT', '/v1/groups/mifu-g', { topic: 'mifu', ...settings, maxInFlight: 5, ordered: true })).status, 200)
  // Five are out; acking two of them must not release anything while more than one is outstanding.
  t.same(
    await ack(
      'mifu-g',
      receiver.requests.slice(0, 2).map((r) => env(r).deliveryId),
    ),
    ['acked', 'acked'],
  )
  await absenceWindow(600) // absence: ordered, nothing new while any message is out
  t.equal(receiver.requests.length, 5, 'ordered: nothing new while three are still out')
  t.same(
    await ack(
      'mifu-g',
      receiver.requests.slice(2, 5).map((r) => env(r).deliveryId),
    ),
    ['acked', 'acked', 'acked'],
  )
  await receiver.waitFor(6)
  await absenceWindow(600) // absence: ordered, the seventh waits for the sixth's ack
  t.equal(receiver.requests.length, 6, 'then one at a time')
})

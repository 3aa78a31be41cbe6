/**
 * Ordering by key (contract v1.1 "Ordering keys"), against a real broker and receiver: one message
 * per key outstanding, in offset order, while other keys flow; a key that retries, waits for its
 * delay or for its ack holds back only its own later messages; dead-lettering releases the key;
 * a seek replays under the same rule. `ordered` and `ordering` are one setting.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, groupStatus, allCompleted, ack } = api(broker)

interface Push {
  key: string | null
  offset: number
  deliveryId: string
  value: unknown
}
const push = (r: Received) => r.json as Push

/**
 * A behaviour that records, as each push arrives, whether a push of the same key was still
 * unanswered (two messages of one key outstanding: what the rule forbids; in auto mode the answer
 * is the completion). Retries of one message are the same offset and are not counted.
 */
function keyWatch(answer: (r: Received) => { status: number; delayMs?: number }) {
  const overlaps: string[] = []
  const requests: Received[] = []
  const behaviour = (r: Received) => {
    const p = push(r)
    const open = requests.filter(
      (q) => !q.closed && q !== r && push(q).key !== null && push(q).key === p.key && push(q).offset !== p.offset,
    )
    if (open.length > 0) overlaps.push(`${p.key}@${p.offset} while ${open.map((q) => push(q).offset).join(',')} open`)
    requests.push(r)
    return answer(r)
  }
  return { overlaps, behaviour }
}

/** For each key, the offsets in the order their pushes arrived. */
function byKey(requests: Received[]): Map<string, number[]> {
  const out = new Map<string, number[]>()
  for (const r of requests) {
    const p = push(r)
    if (p.key === null) continue
    out.set(p.key, [...(out.get(p.key) ?? []), p.offset])
  }
  return out
}

async function keyGroup(name: string, settings: object = {}) {
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 1 })).status, 201)
  const res = await call('PUT', `/v1/groups/${name}-g`, { topic: name, ordering: 'key', maxInFlight: 50, ...settings })
  t.equal(res.status, 201)
  return res.json
}

t.test('ordered and ordering are one setting, reported both ways', async (t) => {
  t.equal((await call('PUT', '/v1/topics/os', { partitions: 1 })).status, 201)
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os' })).json, { ordered: false, ordering: 'none' })
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os', ordered: true })).json, { ordered: true, ordering: 'partition' })
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os', ordering: 'key' })).json, { ordered: false, ordering: 'key' })
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os', maxInFlight: 7 })).json, { ordering: 'key' }, 'kept when not named')
  for (const body of [{ ordered: true, ordering: 'key' }, { ordered: false, ordering: 'partition' }, { ordering: 'keys' }]) {
    const res = await call('PUT', '/v1/groups/os-g', { topic: 'os', ...body })
    t.equal(res.status, 400, JSON.stringify(body))
  }
  t.match((await call('GET', '/v1/groups/os-g')).json, { ordering: 'key' }, 'refused changes changed nothing')
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os', ordered: true, ordering: 'partition' })).json, {
    ordered: true,
    ordering: 'partition',
  })
  t.match((await call('PUT', '/v1/groups/os-g', { topic: 'os', ordered: false })).json, { ordered: false, ordering: 'none' })
})

t.test('a key that keeps failing holds back its own messages only; then they follow in order', async (t) => {
  let stuckFails = true
  const watch = keyWatch((r) => (push(r).key === 'stuck' && stuckFails ? { status: 503 } : { status: 200, delayMs: 2 }))
  const receiver = await startReceiver(t, watch.behaviour)
  await keyGroup('kf', { ackMode: 'auto', maxDeliveries: 1000, retry: { initialDelayMs: 20, multiplier: 1, maxDelayMs: 20, jitter: 0 } })
  t.equal((await call('POST', '/v1/groups/kf-g/consumers', { url: receiver.url })).status, 201)
  const keys = ['stuck', 'a', 'b', 'c', 'd']
  t.equal(
    (
      await produce(
        'kf',
        Array.from({ length: 100 }, (_, i) => ({ key: keys[i % 5], value: i })),
      )
    ).status,
    201,
  )

  // Every message of the other keys arrives while the first of `stuck` is still being retried.
  await waitUntil(
    () => {
      const seen = byKey(receiver.requests)
      return ['a', 'b', 'c', 'd'].every((k) => new Set(seen.get(k)).size === 20) && (seen.get('stuck')?.length ?? 0) >= 5
    },
    20_000,
    'the other keys flow while stuck retries',
  )
  const during = byKey(receiver.requests)
  t.same([...new Set(during.get('stuck'))], [0], 'only the first message of stuck was pushed, again and again')

  stuckFails = false
  await allCompleted('kf-g', 20_000)
  const seen = byKey(receiver.requests)
  for (const k of keys) {
    const offsets = seen.get(k)!
    t.same(
      [...new Set(offsets)],
      Array.from({ length: 20 }, (_, i) => keys.indexOf(k) + 5 * i),
      `${k}: every message, in offset order`,
    )
    t.ok(
      offsets.every((o, i) => i === 0 || o >= offsets[i - 1]!),
      `${k}: never a later message before an earlier one`,
    )
  }
  t.same(watch.overlaps, [], 'never two messages of a key outstanding')
})

t.test('explicit mode: the next message of a key waits for the ack of the one before', async (t) => {
  const receiver = await startReceiver(t)
  await keyGroup('ke', { ackMode: 'explicit', ackTimeoutMs: 60_000 })
  t.equal((await call('POST', '/v1/groups/ke-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce('ke', [
        { key: 'x', value: 'x0' },
        { key: 'y', value: 'y0' },
        { key: 'x', value: 'x1' },
        { value: 'n0' },
        { key: 'y', value: 'y1' },
        { value: 'n1' },
      ])
    ).status,
    201,
  )
  await receiver.waitFor(4, 10_000)
  await waitUntil(async () => (await groupStatus('ke-g')).partitions[0].inFlight === 4, 10_000, 'four outstanding')
  t.same(receiver.requests.map((r) => push(r).value).sort(), ['n0', 'n1', 'x0', 'y0'], 'the first of each key, and the unkeyed ones')

  const idOf = (v: string) => push(receiver.requests.find((r) => push(r).value === v)!).deliveryId
  t.same(await ack('ke-g', [idOf('x0')]), ['acked'])
  await receiver.waitFor(5, 10_000)
  t.equal(push(receiver.requests[4]!).value, 'x1', 'x1 once x0 is acked')
  t.same(await ack('ke-g', [idOf('y0'), idOf('x1'), idOf('n0'), idOf('n1')]), ['acked', 'acked', 'acked', 'acked'])
  await receiver.waitFor(6, 10_000)
  t.equal(push(receiver.requests[5]!).value, 'y1')
  t.same(await ack('ke-g', [idOf('y1')]), ['acked'])
  await allCompleted('ke-g')
})

t.test('a delayed message holds back its key only; dead-lettering releases the key', async (t) => {
  const receiver = await startReceiver(t, (r) => (push(r).value === 'poison' ? { status: 500 } : { status: 200 }))
  await keyGroup('kd', { ackMode: 'auto', maxDeliveries: 2, retry: { initialDelayMs: 10, maxDelayMs: 10, jitter: 0 } })
  t.equal((await call('POST', '/v1/groups/kd-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce('kd', [
        { key: 'late', value: 'late0', delayMs: 3000 },
        { key: 'late', value: 'late1' },
        { key: 'p', value: 'poison' },
        { key: 'p', value: 'p1' },
        { key: 'free', value: 'free0' },
        { key: 'free', value: 'free1' },
      ])
    ).status,
    201,
  )
  await allCompleted('kd-g', 20_000)
  const order = receiver.requests.map((r) => push(r).value)
  const at = (v: string) => order.indexOf(v)
  t.ok(at('late0') < at('late1'), `late1 after the delayed late0 (${order.join(' ')})`)
  t.ok(at('free1') < at('late0'), 'the other keys did not wait for the delay')
  t.equal(order.filter((v) => v === 'poison').length, 2, 'poison had its 2 attempts')
  t.ok(order.lastIndexOf('poison') < at('p1'), 'p1 once poison was dead-lettered')
})

t.test('a seek replays under the same rule', async (t) => {
  const watch = keyWatch(() => ({ status: 200, delayMs: 5 }))
  const receiver = await startReceiver(t, watch.behaviour)
  await keyGroup('ks', { ackMode: 'auto' })
  t.equal((await call('POST', '/v1/groups/ks-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'ks',
        Array.from({ length: 60 }, (_, i) => ({ key: `k${i % 3}`, value: i })),
      )
    ).status,
    201,
  )
  await allCompleted('ks-g', 20_000)
  const first = receiver.requests.length
  t.equal((await call('POST', '/v1/groups/ks-g/seek', { partition: 0, offset: 0 })).status, 200)
  await waitUntil(() => receiver.requests.length >= first + 60, 20_000, 'the replay')
  await allCompleted('ks-g', 20_000)
  const replay = byKey(receiver.requests.slice(first))
  for (const [k, offsets] of replay) {
    t.ok(
      offsets.every((o, i) => i === 0 || o > offsets[i - 1]!),
      `${k}: replayed in offset order`,
    )
  }
  t.same(watch.overlaps, [], 'never two messages of a key outstanding, before or after the seek')
})

t.test('a running group switched to key ordering keeps the rule from then on', async (t) => {
  const watch = keyWatch(() => ({ status: 200, delayMs: 3 }))
  const receiver = await startReceiver(t, watch.behaviour)
  t.equal((await call('PUT', '/v1/topics/kw', { partitions: 2 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/kw-g', { topic: 'kw', ackMode: 'auto', maxInFlight: 50 })).status, 201)
  t.equal((await call('POST', '/v1/groups/kw-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'kw',
        Array.from({ length: 40 }, (_, i) => ({ key: `k${i % 2}`, value: i })),
      )
    ).status,
    201,
  )
  await allCompleted('kw-g', 20_000)
  const before = receiver.requests.length
  const switched = await call('PUT', '/v1/groups/kw-g', { topic: 'kw', ordering: 'key' })
  t.match(switched.json, { ordering: 'key' })
  watch.overlaps.length = 0
  t.equal(
    (
      await produce(
        'kw',
        Array.from({ length: 60 }, (_, i) => ({ key: `k${i % 3}`, value: 100 + i })),
      )
    ).status,
    201,
  )
  await allCompleted('kw-g', 20_000)
  t.equal(receiver.requests.length - before, 60, 'every new message pushed once')
  t.same(watch.overlaps, [], 'one message of a key outstanding at a time after the switch')
})

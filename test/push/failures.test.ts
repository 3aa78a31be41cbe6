/**
 * Failed pushes against the real broker: growing backoff, Retry-After, 410 Gone, redirects,
 * consumers that hang, reset or flap; every attempt checked in the deliveries table.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { env, pushGroups, timedReceiver } from '../helpers/push-group.ts'
import { startReceiver, type BehaviourSpec } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus, allCompleted } = api(broker)
// The tests run side by side on the one broker: each has its own topics, groups and receivers, and
// most of a test's time is a backoff or a Retry-After passing, which they need not take in turn.
t.jobs = 4
const { topicAndGroup, addConsumer, attemptRows } = pushGroups({ call, sql })

t.test('backoff gaps grow: ~100, ~400, ~1600 ms with jitter 0 and multiplier 4', async (t) => {
  await topicAndGroup(t, 'bo', {
    ackMode: 'auto',
    maxDeliveries: 4,
    retry: { initialDelayMs: 100, multiplier: 4, maxDelayMs: 10_000, jitter: 0 },
  })
  const { receiver, times } = await timedReceiver(t, () => ({ status: 500, body: 'down' }))
  await addConsumer('bo-g', receiver.url)
  await produce('bo', [{ value: 'x' }])
  await receiver.waitFor(4)
  await allCompleted('bo-g')
  const gaps = [times[1]! - times[0]!, times[2]! - times[1]!, times[3]! - times[2]!]
  t.comment(`gaps: ${gaps.join(', ')} ms`)
  const nominal = [100, 400, 1600]
  for (const [i, gap] of gaps.entries()) {
    t.ok(gap >= nominal[i]! - 10, `gap ${i + 1} (${gap} ms) is at least ~${nominal[i]} ms`)
    // Generous above: a busy machine only delays a retry.
    t.ok(gap < nominal[i]! + 2000, `gap ${i + 1} (${gap} ms) is not far above ${nominal[i]} ms`)
  }
  // A constant backoff cannot pass both: the last gap is at least ~1600 ms, the first well under it.
  t.ok(gaps[0]! < nominal[2]! - 10, `the first gap (${gaps[0]} ms) is shorter than the last one can be`)
  t.same(
    receiver.requests.map((r) => env(r).attempt),
    [1, 2, 3, 4],
  )
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('bo-g')
      return r.at(-1)?.outcome === 'dead' ? r : undefined
    },
    30_000,
    'last attempt dead',
  )
  t.same(
    rows.map((r) => r.outcome),
    ['failed', 'failed', 'failed', 'dead'],
  )
  // Dead-lettered and forgotten: nothing is outstanding, so there is no fifth attempt to come.
  await waitUntil(async () => (await groupStatus('bo-g')).partitions[0].inFlight === 0, 30_000, 'nothing outstanding')
  t.equal(receiver.requests.length, 4, 'no attempt after maxDeliveries')
  t.ok(
    rows.every((r) => r.status_code === 500 && /HTTP 500/.test(r.error)),
    'status code and error recorded on each attempt',
  )
})

t.test('Retry-After on 503 and 429 is honoured, and capped by maxDelayMs; ignored on 500', async (t) => {
  const cases: { name: string; first: BehaviourSpec; maxDelayMs: number; min: number; max: number }[] = [
    {
      name: '503 Retry-After: 1',
      first: { status: 503, headers: { 'retry-after': '1' } },
      maxDelayMs: 5000,
      min: 1000 - 5,
      max: 1000 + 3000,
    },
    {
      name: '429 Retry-After: 1',
      first: { status: 429, headers: { 'retry-after': '1' } },
      maxDelayMs: 5000,
      min: 1000 - 5,
      max: 1000 + 3000,
    },
    {
      name: '429 Retry-After: 30, capped at maxDelayMs 700',
      first: { status: 429, headers: { 'retry-after': '30' } },
      maxDelayMs: 700,
      min: 700 - 5,
      max: 700 + 3000,
    },
    {
      name: '503 Retry-After as an HTTP-date ~2 s ahead',
      first: { status: 503, headers: { 'retry-after': '' } },
      maxDelayMs: 5000,
      min: 900,
      max: 2000 + 2500,
    },
    {
      name: '500 with Retry-After: 5 (not honoured: only 429/503)',
      first: { status: 500, headers: { 'retry-after': '5' } },
      maxDelayMs: 5000,
      min: 50 - 5,
      max: 3000,
    },
  ]
  for (const [i, c] of cases.entries()) {
    const name = `ra${i}`
    await topicAndGroup(t, name, { ackMode: 'auto', retry: { initialDelayMs: 50, multiplier: 1, maxDelayMs: c.maxDelayMs, jitter: 0 } })
    const { receiver, times } = await timedReceiver(t, (_req, n) => {
      if (n > 1) return { status: 200 }
      const headers = { ...c.first.headers }
      if (headers['retry-after'] === '') headers['retry-after'] = new Date(Date.now() + 2000).toUTCString()
      return { ...c.first, headers }
    })
    await addConsumer(`${name}-g`, receiver.url)
    await produce(name, [{ value: c.name }])
    await receiver.waitFor(2)
    const gap = times[1]! - times[0]!
    t.ok(gap >= c.min && gap < c.max, `${c.name}: retried after ${gap} ms (expected ${c.min}..${c.max})`)
    await allCompleted(`${name}-g`)
  }
})

t.test('410 Gone disables the consumer: status shows it, its partitions move, pushes stop', async (t) => {
  await topicAndGroup(t, 'gone', { ackMode: 'auto', retry: { initialDelayMs: 200, maxDelayMs: 200, jitter: 0 } }, 2)
  const a = await startReceiver(t, { status: 410, body: 'gone for good' })
  const b = await startReceiver(t)
  const aId = await addConsumer('gone-g', a.url)
  const bId = await addConsumer('gone-g', b.url)
  t.same(
    (await groupStatus('gone-g')).partitions.map((p: { consumerId: string }) => p.consumerId),
    [aId, bId],
    'p0 → a, p1 → b',
  )
  await produce('gone', [
    { value: 'p0', partition: 0 },
    { value: 'p1', partition: 1 },
  ])
  await a.waitFor(1)
  await allCompleted('gone-g')
  const s = await groupStatus('gone-g')
  const ca = s.consumers.find((c: { id: string }) => c.id === aId)
  t.match(ca, { disabled: true, disabledReason: /410/ }, 'consumer a shows disabled')
  t.match(
    s.consumers.find((c: { id: string }) => c.id === bId),
    { disabled: false },
  )
  t.same(
    s.partitions.map((p: { consumerId: string }) => p.consumerId),
    [bId, bId],
    'both partitions now go to b',
  )
  t.same(b.requests.map((r) => env(r).value).sort(), ['p0', 'p1'], 'b got p0 (retried there) and p1')
  await produce('gone', [{ value: 'later', partition: 0 }])
  await b.waitFor(3)
  t.equal(env(b.requests[2]).value, 'later', "a message produced later goes to b, a's partition's new consumer")
  t.equal(a.requests.length, 1, 'the disabled consumer gets nothing after its 410')
  await waitUntil(
    async () => (await attemptRows('gone-g')).some((r) => r.status_code === 410 && r.outcome === 'failed'),
    30_000,
    '410 attempt row',
  )

  // The only consumer goes: its partitions have no consumer; a new registration picks them up.
  await topicAndGroup(t, 'gone1', { ackMode: 'auto', retry: { initialDelayMs: 200, maxDelayMs: 200, jitter: 0 } }, 2)
  const only = await startReceiver(t, { status: 410 })
  await addConsumer('gone1-g', only.url)
  await produce('gone1', [{ value: 'q', partition: 1 }])
  await only.waitFor(1)
  await waitUntil(
    async () => (await groupStatus('gone1-g')).partitions.every((p: { consumerId: string | null }) => p.consumerId === null),
    30_000,
    'no partition has a consumer',
  )
  // Absence: the retry (200 ms after the 410) must not go to the disabled consumer.
  await absenceWindow(800)
  t.equal(only.requests.length, 1, 'not pushed again to the disabled consumer')
  only.setBehaviour({ status: 200 })
  const againId = await addConsumer('gone1-g', only.url) // registered again: enabled
  t.not(againId, undefined)
  await allCompleted('gone1-g')
  t.equal(only.requests.length, 2, 'delivered once it was registered again')
})

t.test('410 Gone with a zero backoff: the disabled consumer still gets no second push', async (t) => {
  await topicAndGroup(t, 'gone0', { ackMode: 'auto', maxDeliveries: 5, retry: { initialDelayMs: 0, maxDelayMs: 0, jitter: 0 } }, 2)
  const a = await startReceiver(t, { status: 410 })
  const b = await startReceiver(t)
  await addConsumer('gone0-g', a.url)
  await addConsumer('gone0-g', b.url)
  await produce('gone0', [{ value: 'p0', partition: 0 }])
  await allCompleted('gone0-g')
  // A message's attempts go one after another and the receiver records a request before it answers:
  // any push to a came before the one to b that completed the message, and is counted by now.
  t.equal(a.requests.length, 1, `pushes to the consumer after it answered 410: ${a.requests.length - 1}`)
  t.equal(b.requests.length, 1, 'the message reached the other consumer')
})

t.test('redirects are never followed: 302 and 307 are failed attempts; the target gets nothing', async (t) => {
  const target = await startReceiver(t)
  for (const [name, spec] of [
    ['r302', { redirectTo: `${target.url}/moved` }],
    ['r307', { status: 307, headers: { location: `${target.url}/moved` } }],
  ] as const) {
    await topicAndGroup(t, name, { ackMode: 'auto', maxDeliveries: 2, retry: { initialDelayMs: 50, maxDelayMs: 50, jitter: 0 } })
    const r = await startReceiver(t, spec)
    await addConsumer(`${name}-g`, r.url)
    await produce(name, [{ value: name }])
    await r.waitFor(2)
    await allCompleted(`${name}-g`)
    const code = name === 'r302' ? 302 : 307
    await waitUntil(
      async () => {
        const rows = await attemptRows(`${name}-g`)
        return (
          rows.length === 2 &&
          rows.every((x) => x.status_code === code && new RegExp(`HTTP ${code}`).test(x.error)) &&
          rows[0].outcome === 'failed' &&
          rows[1].outcome === 'dead'
        )
      },
      30_000,
      `${name}: attempt rows record the ${code}`,
    )
  }
  // A redirect followed would have been requested within the push, before its answer was recorded
  // (and the answer would have been the target's 200, not the redirect).
  t.equal(target.requests.length, 0, 'the redirect target received nothing')
})

t.test('a consumer that hangs: the push times out, is retried, and is delivered', async (t) => {
  await topicAndGroup(t, 'hang', {
    ackMode: 'auto',
    pushTimeoutMs: 300,
    ackTimeoutMs: 5000,
    retry: { initialDelayMs: 50, maxDelayMs: 50, jitter: 0 },
  })
  const { receiver, times } = await timedReceiver(t, (_req, n) => (n === 1 ? { hang: true } : { status: 200 }))
  await addConsumer('hang-g', receiver.url)
  await produce('hang', [{ value: 'h' }])
  await receiver.waitFor(2)
  await allCompleted('hang-g')
  t.ok(
    times[1]! - times[0]! >= 250,
    `retried after the 300 ms push timeout (counted from the push's start) and the 50 ms backoff (${times[1]! - times[0]!} ms)`,
  )
  t.ok(times[1]! - times[0]! < 4000, 'not waiting for the 5 s ack deadline')
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('hang-g')
      return r.length === 2 && r[1].outcome === 'acked' ? r : undefined
    },
    30_000,
    'two attempt rows, the second acked',
  )
  // A push with no answer within pushTimeoutMs is a failed attempt (timed_out is for an ack
  // deadline, 5 s here, which the hung push never reached).
  t.same(
    { outcome: rows[0].outcome, status_code: rows[0].status_code, error: rows[0].error },
    { outcome: 'failed', status_code: null, error: 'no answer within 300 ms' },
    'attempt 1 failed: no answer in time',
  )
})

t.test('a consumer that resets the connection: a failed attempt with the network error, then delivered', async (t) => {
  await topicAndGroup(t, 'rst', { ackMode: 'auto', retry: { initialDelayMs: 50, maxDelayMs: 50, jitter: 0 } })
  const { receiver } = await timedReceiver(t, (_req, n) => (n === 1 ? { reset: true } : { status: 200 }))
  await addConsumer('rst-g', receiver.url)
  await produce('rst', [{ value: 'r' }])
  await receiver.waitFor(2)
  await allCompleted('rst-g')
  const rows = await waitUntil(
    async () => {
      const rows = await attemptRows('rst-g')
      return rows.length === 2 && rows[1].outcome === 'acked' ? rows : undefined
    },
    30_000,
    'two attempt rows',
  )
  t.equal(rows[0].outcome, 'failed')
  t.equal(rows[0].status_code, null, 'no HTTP status for a reset')
  t.ok(typeof rows[0].error === 'string' && rows[0].error.length > 0, `error recorded: ${rows[0].error}`)
})

t.test('a flapping consumer (500, 503, then 200) gets every message delivered; attempts recorded per message', async (t) => {
  await topicAndGroup(
    t,
    'flap',
    { ackMode: 'auto', maxDeliveries: 5, retry: { initialDelayMs: 50, multiplier: 2, maxDelayMs: 200, jitter: 0 } },
    2,
  )
  const seen = new Map<string, number>()
  const { receiver } = await timedReceiver(t, (req) => {
    const key = String(env(req).value)
    const n = (seen.get(key) ?? 0) + 1
    seen.set(key, n)
    return n === 1 ? { status: 500, body: 'flap' } : n === 2 ? { status: 503 } : { status: 200 }
  })
  await addConsumer('flap-g', receiver.url)
  await produce(
    'flap',
    Array.from({ length: 6 }, (_, i) => ({ value: `m${i}`, partition: i % 2 })),
  )
  await receiver.waitFor(18)
  await allCompleted('flap-g')
  t.equal(seen.size, 6)
  t.ok(
    [...seen.values()].every((n) => n === 3),
    'each message: exactly three attempts',
  )
  await waitUntil(
    async () => {
      const rows = await attemptRows('flap-g')
      if (rows.length !== 18) return false
      for (let i = 0; i < 18; i += 3) {
        const [a, b, c] = rows.slice(i, i + 3)
        if (a.outcome !== 'failed' || a.status_code !== 500 || !/HTTP 500: flap/.test(a.error)) return false
        if (b.outcome !== 'failed' || b.status_code !== 503) return false
        if (c.outcome !== 'acked' || c.status_code !== 200 || c.attempt !== 3) return false
      }
      return true
    },
    30_000,
    'rows: failed 500, failed 503, acked 200 for each message',
  )
})

/**
 * A consumer's fixed limits (contract v1.1 "Consumer limits"): maxConcurrency caps the pushes in
 * flight to it, rateLimitPerSecond the pushes started in any one second, both on top of the
 * adaptive push window; PATCH changes a consumer in place. Measured at a real receiver, with
 * margins for the time a request takes to arrive, and no bound on how fast the machine is.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus, allCompleted } = api(broker)

/** When the group's pushes started (epoch ms, in order), once its attempt log has all `n` rows. */
async function startTimes(group: string, n: number): Promise<number[]> {
  const read = async () =>
    (
      await sql(
        `SELECT (extract(epoch from d.started_at) * 1000)::float8 AS ms FROM deliveries d
    JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = $1 ORDER BY d.started_at`,
        [group],
      )
    ).map((r: { ms: number }) => r.ms)
  return waitUntil(
    async () => {
      const times = await read()
      return times.length >= n ? times : undefined
    },
    10_000,
    `${n} attempt rows of ${group}`,
  )
}

/** A receiver answering 200 after 30 ms that records, for each request, how many it held open as it arrived (itself included). */
async function concurrencyReceiver(t: { teardown(fn: () => unknown): void }) {
  const open: number[] = []
  const receiver = await startReceiver(t, (req: Received) => {
    open.push(receiver.requests.filter((r) => !r.closed && r !== req).length + 1)
    return { status: 200, delayMs: 30 }
  })
  return { receiver, open }
}

async function group(name: string, partitions: number) {
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  t.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name, ackMode: 'auto', maxInFlight: 50 })).status, 201)
}

t.test('limits are validated, reported, changed in place and removed with null', async (t) => {
  await group('lim', 4)
  const receiver = await startReceiver(t)
  for (const bad of [
    { url: receiver.url, rateLimitPerSecond: 0 },
    { url: receiver.url, rateLimitPerSecond: -1 },
    { url: receiver.url, maxConcurrency: 0 },
    { url: receiver.url, maxConcurrency: 1001 },
    { url: receiver.url, maxConcurrency: 1.5 },
    { url: receiver.url, rateLimitPerSecond: 'fast' },
    // Below one push every 10,000 s, or above 1,000,000 a second (see src/core/consumer-limits.ts).
    { url: receiver.url, rateLimitPerSecond: 0.00009 },
    { url: receiver.url, rateLimitPerSecond: 1e-7 },
    { url: receiver.url, rateLimitPerSecond: 1_000_001 },
  ]) {
    const res = await call('POST', '/v1/groups/lim-g/consumers', bad)
    t.equal(res.status, 400, `refused: ${JSON.stringify(bad)}`)
    t.equal(res.json.type.endsWith('invalid_request'), true)
  }
  t.same((await call('GET', '/v1/groups/lim-g/consumers')).json.consumers, [], 'a refused registration stored nothing')

  const a = await call('POST', '/v1/groups/lim-g/consumers', { url: receiver.url, rateLimitPerSecond: 2.5, maxConcurrency: 3 })
  t.equal(a.status, 201)
  t.equal(a.json.rateLimitPerSecond, 2.5)
  t.equal(a.json.maxConcurrency, 3)
  const b = (await call('POST', '/v1/groups/lim-g/consumers', { url: receiver.url })).json
  t.equal(b.rateLimitPerSecond, null, 'no limit: null')
  t.equal(b.maxConcurrency, null)
  const owners = (await groupStatus('lim-g')).partitions.map((p: { consumerId: string }) => p.consumerId)

  for (const bad of [
    {},
    { maxConcurrency: 0 },
    { url: 'ftp://127.0.0.1/x' },
    { url: 'http://u:p@127.0.0.1/' },
    { secret: 'whsec_x' },
    { rateLimitPerSecond: 0 },
    { rateLimitPerSecond: 4e-7 },
  ]) {
    const res = await call('PATCH', `/v1/groups/lim-g/consumers/${a.json.id}`, bad)
    t.equal(res.status, 400, `PATCH refused: ${JSON.stringify(bad)}`)
  }
  t.equal((await call('PATCH', '/v1/groups/lim-g/consumers/nope', { maxConcurrency: 1 })).status, 404)
  t.equal((await call('PATCH', '/v1/groups/nope/consumers/nope', { maxConcurrency: 1 })).status, 404)
  const unchanged = (await call('GET', '/v1/groups/lim-g/consumers')).json.consumers.find((c: { id: string }) => c.id === a.json.id)
  t.match(unchanged, { rateLimitPerSecond: 2.5, maxConcurrency: 3, url: a.json.url }, 'refused changes changed nothing')

  const other = await startReceiver(t)
  const patched = await call('PATCH', `/v1/groups/lim-g/consumers/${a.json.id}`, { url: other.url, rateLimitPerSecond: null })
  t.equal(patched.status, 200)
  t.match(
    patched.json,
    { id: a.json.id, url: `${other.url}/`, rateLimitPerSecond: null, maxConcurrency: 3 },
    'url changed, rate removed, cap kept',
  )
  t.same(
    (await groupStatus('lim-g')).partitions.map((p: { consumerId: string }) => p.consumerId),
    owners,
    'its partitions stay',
  )

  // The new url gets the pushes of its partitions.
  t.equal(
    (
      await produce(
        'lim',
        Array.from({ length: 20 }, (_, k) => ({ value: k })),
      )
    ).status,
    201,
  )
  await allCompleted('lim-g')
  const mine = (await groupStatus('lim-g')).partitions.filter((p: { consumerId: string }) => p.consumerId === a.json.id)
  const pushedThere = other.requests.map((r) => (r.json as { partition: number }).partition)
  t.ok(
    pushedThere.length > 0 && pushedThere.every((p) => mine.some((m: { partition: number }) => m.partition === p)),
    "the consumer's partitions were pushed to its new url",
  )
})

t.test('maxConcurrency caps the pushes in flight to a consumer across its partitions', async (t) => {
  await group('cap', 8)
  const { receiver, open } = await concurrencyReceiver(t)
  t.equal((await call('POST', '/v1/groups/cap-g/consumers', { url: receiver.url, maxConcurrency: 2 })).status, 201)
  t.equal(
    (
      await produce(
        'cap',
        Array.from({ length: 120 }, (_, k) => ({ value: k })),
      )
    ).status,
    201,
  )
  await allCompleted('cap-g', 60_000)
  t.equal(open.length, 120, 'every message pushed once')
  t.equal(Math.max(...open), 2, 'never more than 2 pushes at once, and 2 were used')

  // Lifted: the adaptive window (initially 8) is the limit again.
  const id = (await call('GET', '/v1/groups/cap-g/consumers')).json.consumers[0].id
  t.equal((await call('PATCH', `/v1/groups/cap-g/consumers/${id}`, { maxConcurrency: null })).status, 200)
  open.length = 0
  t.equal(
    (
      await produce(
        'cap',
        Array.from({ length: 120 }, (_, k) => ({ value: k })),
      )
    ).status,
    201,
  )
  await allCompleted('cap-g', 60_000)
  t.ok(Math.max(...open) > 2, `without the cap more pushes run at once (${Math.max(...open)})`)
})

t.test('rateLimitPerSecond bounds the pushes in any one second', async (t) => {
  await group('rate', 4)
  const receiver = await startReceiver(t)
  const RATE = 20
  t.equal((await call('POST', '/v1/groups/rate-g/consumers', { url: receiver.url, rateLimitPerSecond: RATE })).status, 201)
  const N = 70
  t.equal(
    (
      await produce(
        'rate',
        Array.from({ length: N }, (_, k) => ({ value: k })),
      )
    ).status,
    201,
  )
  await allCompleted('rate-g', 60_000)
  t.equal(receiver.requests.length, N)
  // The limit is on the moments pushes start, which the attempt rows record (started_at): at a
  // receiver, arrivals also carry each request's own delay, which a busy machine stretches.
  const times = await startTimes('rate-g', N)
  t.equal(times.length, N)
  let most = 0
  for (let i = 0; i < times.length; i++) {
    let j = i
    while (j < times.length && times[j]! - times[i]! < 999) j++
    most = Math.max(most, j - i)
  }
  t.equal(most, RATE, `${RATE} pushes started in some second, never more in any second`)
  t.ok(
    times.at(-1)! - times[0]! >= (Math.ceil(N / RATE) - 1) * 1000 - 2,
    `${N} pushes took at least ${Math.ceil(N / RATE) - 1} s (${times.at(-1)! - times[0]!} ms)`,
  )
  const metrics = (await broker.app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(metrics, /hookq_rate_limited_waits_total\{group="rate-g"\} [1-9]/, 'the waits are counted')
})

t.test('a rate below one a second spaces the pushes', async (t) => {
  await group('slow', 1)
  const receiver = await startReceiver(t)
  t.equal((await call('POST', '/v1/groups/slow-g/consumers', { url: receiver.url, rateLimitPerSecond: 0.5 })).status, 201)
  t.equal((await produce('slow', [{ value: 1 }, { value: 2 }])).status, 201)
  await receiver.waitFor(2, 20_000)
  await waitUntil(async () => (await groupStatus('slow-g')).partitions[0].lag === 0, 10_000, 'completed')
  const [first, second] = (await startTimes('slow-g', 2)) as [number, number]
  t.ok(second - first >= 1998, `one push every 2 s (started ${second - first} ms apart)`)
})

t.test('the slowest rate is one push every 10,000 s; a slower one stored earlier sets no runaway timer', async (t) => {
  await group('tiny', 1)
  const receiver = await startReceiver(t)
  const slowest = await call('POST', '/v1/groups/tiny-g/consumers', { url: receiver.url, rateLimitPerSecond: 0.0001 })
  t.equal(slowest.status, 201, 'the bound itself is accepted')
  // As a broker before the range stored it (the API took anything above 0): its window, 10^12 s,
  // is past what setTimeout holds, which then fired every 1 ms with a TimeoutOverflowWarning.
  await sql('UPDATE consumers SET rate_limit_per_second = 1e-9 WHERE id = $1', [slowest.json.id])
  t.equal((await call('PATCH', `/v1/groups/tiny-g/consumers/${slowest.json.id}`, { maxConcurrency: 1000 })).status, 200)
  const warnings: string[] = []
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`)
  process.on('warning', onWarning)
  t.teardown(() => process.off('warning', onWarning))
  t.equal((await produce('tiny', [{ value: 1 }, { value: 2 }])).status, 201)
  await receiver.waitFor(1, 10_000)
  // The second message waits for the rate; a timer loop would show at once, in its warnings.
  await absenceWindow(500)
  t.same(
    warnings.filter((w) => w.startsWith('TimeoutOverflowWarning')),
    [],
    'no timer past what setTimeout holds',
  )
  t.equal(receiver.requests.length, 1, 'the second push waits for the rate')
  t.equal(
    (await call('GET', '/v1/groups/tiny-g/consumers')).json.consumers[0].rateLimitPerSecond,
    1e-9,
    'the stored value is reported as it is',
  )
})

t.test('under batch push maxConcurrency caps batch requests in flight, not messages', async (t) => {
  t.equal((await call('PUT', '/v1/topics/capb', { partitions: 4 })).status, 201)
  t.equal(
    (await call('PUT', '/v1/groups/capb-g', { topic: 'capb', ackMode: 'auto', maxInFlight: 50, batch: { maxMessages: 20 } })).status,
    201,
  )
  const { receiver, open } = await concurrencyReceiver(t)
  t.equal((await call('POST', '/v1/groups/capb-g/consumers', { url: receiver.url, maxConcurrency: 1 })).status, 201)
  t.equal(
    (
      await produce(
        'capb',
        Array.from({ length: 200 }, (_, k) => ({ value: k })),
      )
    ).status,
    201,
  )
  await allCompleted('capb-g', 60_000)
  const sizes = receiver.requests.map((r) => (r.json as { deliveries: unknown[] }).deliveries.length)
  t.equal(
    sizes.reduce((a, b) => a + b, 0),
    200,
    'every message once',
  )
  t.equal(Math.max(...open), 1, 'one batch request at a time')
  t.ok(Math.max(...sizes) > 1, `and batches of more than one message (up to ${Math.max(...sizes)})`)
})

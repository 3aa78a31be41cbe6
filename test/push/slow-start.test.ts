/**
 * Push concurrency towards one consumer adapts (slow start, like Pub/Sub push): it collapses to
 * about one push at a time while the consumer fails, grows back while it keeps up, and never
 * passes HOOKQ_PUSH_WINDOW_MAX. Concurrency is measured at a real receiver: requests it holds
 * open when a new one arrives.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver, type BehaviourSpec } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const WINDOW_MAX = 24
const broker = await startBroker(t, { HOOKQ_PUSH_WINDOW_INITIAL: '8', HOOKQ_PUSH_WINDOW_MAX: String(WINDOW_MAX) })
const { call, produce, allCompleted } = api(broker)

t.test('a failing consumer gets one push at a time; a healed one gets more, up to the ceiling', async (t) => {
  type Phase = 'failing' | 'healthy'
  let phase = 'failing' as Phase
  /** Per phase, the number of requests the receiver held open as each one arrived (itself included). */
  const open: Record<Phase, number[]> = { failing: [], healthy: [] }
  const receiver = await startReceiver(t, (req): BehaviourSpec => {
    open[phase].push(receiver.requests.filter((r) => !r.closed && r !== req).length + 1)
    return phase === 'failing' ? { status: 503, delayMs: 20, body: 'overloaded' } : { status: 200, delayMs: 40 }
  })

  t.equal((await call('PUT', '/v1/topics/ss', { partitions: 8 })).status, 201)
  t.equal(
    (
      await call('PUT', '/v1/groups/ss-g', {
        topic: 'ss',
        ackMode: 'auto',
        maxInFlight: 100,
        maxDeliveries: 1000,
        retry: { initialDelayMs: 20, multiplier: 2, maxDelayMs: 100, jitter: 0.2 },
      })
    ).status,
    201,
  )
  t.equal((await call('POST', '/v1/groups/ss-g/consumers', { url: receiver.url })).status, 201)
  for (let i = 0; i < 4; i++) {
    t.equal(
      (
        await produce(
          'ss',
          Array.from({ length: 200 }, (_, k) => ({ value: i * 200 + k })),
        )
      ).status,
      201,
    )
  }

  // Failing: the first round may use the initial window of 8; after that, one at a time (two at
  // the moment one ends as the next starts).
  await waitUntil(() => open.failing.length >= 80, 20_000, '80 failed pushes')
  t.ok(
    Math.max(...open.failing.slice(0, 8)) <= 8 + 1,
    `the first round stays within the initial window (${Math.max(...open.failing.slice(0, 8))})`,
  )
  const late = open.failing.slice(30)
  t.ok(Math.max(...late) <= 2, `after the first failures at most ~1 push at a time (max ${Math.max(...late)} over ${late.length} pushes)`)

  const windowNow = async () => {
    const res = await broker.app.inject({ method: 'GET', url: '/metrics' })
    const m = /^hookq_push_window\{consumer="[^"]+"\} (\d+)$/m.exec(res.body)
    return m ? Number(m[1]) : undefined
  }
  t.ok((await windowNow())! <= 2, 'the hookq_push_window gauge shows the collapsed window')

  phase = 'healthy'
  await waitUntil(() => Math.max(0, ...open.healthy) >= 16, 20_000, 'concurrency grows back to 16')
  await allCompleted('ss-g', 60_000)
  const peak = Math.max(...open.healthy)
  t.ok(peak >= 16 && peak <= WINDOW_MAX, `healed: up to ${peak} pushes at once, never more than ${WINDOW_MAX}`)
  t.equal(await windowNow(), WINDOW_MAX, 'the window reached its ceiling')
})

/**
 * Attempt numbers when a process leaves with pushes begun but not sent: a consumer with more pushes
 * under way than the push client's connections to it (32) has the rest waiting in the client's
 * queue, their attempts begun. The process stops (SIGTERM) while the consumer holds every request
 * it got: the queued pushes never go out, and the next process must push them as attempt 1, not 2
 * (CI once saw attempt 2 with no attempt 1 anywhere: the leaving process had counted the queued
 * pushes as made). The attempt log must show no attempt that the consumer never received.
 */
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

/** The push client's connections per origin (src/dispatch/pusher.ts createPushAgent). */
const CONNECTIONS = 32
const TOTAL = 2 * CONNECTIONS

t.test('pushes queued for a connection when their process leaves are the next owner’s attempt 1', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  // A push window wide enough from the start for every message at once: half of them queue in the client.
  const spawn = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_PUSH_WINDOW_INITIAL: String(TOTAL) })
  const a = await spawn()

  let release: () => void = () => {}
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  let holding = true
  const received = new Map<number, number[]>()
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { offset: number; attempt: number }
    received.set(env.offset, [...(received.get(env.offset) ?? []), env.attempt])
    // The first process's pushes are held (its connections stay busy); the next one's are answered.
    return holding ? { after: held } : { status: 200 }
  })

  t.equal((await call(a.url, 'PUT', '/v1/topics/mq', { partitions: 1 })).status, 201)
  const group = { topic: 'mq', ackMode: 'auto', pushTimeoutMs: 120_000, ackTimeoutMs: 120_000, maxInFlight: TOTAL, maxDeliveries: 10 }
  t.equal((await call(a.url, 'PUT', '/v1/groups/mq-g', group)).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/mq-g/consumers', { url: receiver.url })).status, 201)
  const produced = await call(a.url, 'POST', '/v1/topics/mq/messages', {
    messages: Array.from({ length: TOTAL }, (_, i) => ({ value: i })),
  })
  t.equal(produced.status, 201)

  // Every message's push is under way (the window counts it from its start), and the consumer holds
  // as many as there are connections: the others wait in the client for one.
  const inFlight = async () => {
    const res = await fetch(`${a.url}/metrics`)
    const m = /^hookq_pushes_in_flight\{[^}]*\} (\d+)/m.exec(await res.text())
    return Number(m?.[1] ?? 0)
  }
  await waitUntil(async () => receiver.requests.length === CONNECTIONS && (await inFlight()) === TOTAL, 60_000, 'pushes queued')
  t.equal(receiver.requests.length, CONNECTIONS, 'no more pushes reached the consumer than there are connections')
  // Every attempt's row filed in flight (the attempt log holds a row about a second for its outcome):
  // the queued ones must be given back by deleting their rows, not merely by never filing them.
  await waitUntil(
    async () => {
      const res = await call(a.url, 'GET', '/v1/groups/mq-g/deliveries?limit=1000')
      return res.status === 200 && res.json.deliveries.length === TOTAL
    },
    60_000,
    'every attempt filed',
    100,
  )

  a.child.kill('SIGTERM')
  t.equal(await a.exited, 0, 'the leaving process exits 0')
  t.equal(receiver.requests.length, CONNECTIONS, 'the queued pushes did not go out while it left')
  const sentBefore = new Set(received.keys())
  holding = false
  release()

  const b = await spawn()
  await waitUntil(
    async () => {
      const res = await call(b.url, 'GET', '/v1/groups/mq-g')
      return res.status === 200 && res.json.partitions?.[0]?.committedOffset === TOTAL
    },
    120_000,
    'every message delivered by the next process',
    100,
  )

  const wrong = [...received]
    .filter(([, attempts]) => attempts.some((n, i) => n !== i + 1))
    .map(([offset, attempts]) => `offset ${offset}: ${attempts.join(',')}`)
  t.same(wrong, [], 'each message was pushed as attempt 1, 2, ... with none skipped')
  t.equal(received.size, TOTAL, 'every message was pushed')
  for (let offset = 0; offset < TOTAL; offset++) {
    const expected = sentBefore.has(offset) ? [1, 2] : [1]
    if (JSON.stringify(received.get(offset)) !== JSON.stringify(expected)) {
      t.same(
        received.get(offset),
        expected,
        `offset ${offset}: ${sentBefore.has(offset) ? 'held, then pushed again' : 'queued, then pushed once'}`,
      )
    }
  }

  // The attempt log: every attempt it lists reached the consumer, and every one that did is listed.
  const log = await call(b.url, 'GET', '/v1/groups/mq-g/deliveries?limit=1000')
  t.equal(log.status, 200)
  const logged = (log.json.deliveries as { offset: number; attempt: number }[]).map((d) => `${d.offset}/${d.attempt}`).sort()
  const pushed = [...received].flatMap(([offset, attempts]) => attempts.map((n) => `${offset}/${n}`)).sort()
  t.same(logged, pushed, 'the attempt log lists exactly the pushes the consumer received')
})

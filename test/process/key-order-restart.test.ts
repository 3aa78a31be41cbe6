// Ordering by key across a SIGKILL: the restarted broker rebuilds which message of each key is
// outstanding from the committed offset alone, so two messages of one key are never out at once,
// before, across or after the kill, and each key's messages are completed in offset order.
import t from '../helpers/tap.ts'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver, type Received } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test(
  'SIGKILL mid-stream keeps one message per key outstanding',
  { skip: databaseServerUrl ? false : 'needs a PostgreSQL server (set DATABASE_URL)' },
  async (t) => {
    const env = { DATABASE_URL: (await testDatabase(t)).url }
    let broker: BrokerProcess = await spawnBroker(env)
    t.teardown(() => {
      broker.child.kill('SIGKILL')
    })
    let base = broker.url

    interface Push {
      key: string
      offset: number
      attempt: number
      deliveryId: string
    }
    /** Per key, what happened to it and when (printed if its order fails: the race is rare, so a failure should say all it can). */
    const events = new Map<string, string[]>()
    const t0 = Date.now()
    const note = (key: string, what: string) =>
      events.set(key, [...(events.get(key) ?? []), `+${Date.now() - t0}ms g${generation} ${what}`])
    /** Per key, the offset pushed and not yet acked by this consumer (it counts from sending the ack: the broker may push the next before the ack's answer is back here). */
    const out = new Map<string, number>()
    const overlaps: string[] = []
    /**
     * Per key, the offsets the broker answered `acked`, in the order their acks were sent. Not in the
     * order the answers came back: two ack calls of a key can be under way at once (the broker
     * pushes the next message once it has taken the ack, before its answer is back here), and
     * their answers may arrive in either order (seen in CI: 250's answer before 242's, though 242's
     * ack was sent, and taken, before 250 was even pushed).
     */
    const acked = new Map<string, { offset: number; sent: number }[]>()
    let sends = 0
    let generation = 1
    // Answers 200 at once and acks a little later over HTTP, like a consumer library. A message of a
    // key pushed while another offset of that key is still unacked breaks the rule; after the kill
    // the unacked ones are pushed again (the same offset), which is allowed.
    const receiver = await startReceiver(t, (req: Received) => {
      const p = req.json as Push
      const holding = out.get(p.key)
      if (holding !== undefined && holding !== p.offset)
        overlaps.push(`${p.key}@${p.offset} while ${holding} was out (generation ${generation})`)
      out.set(p.key, p.offset)
      note(p.key, `push ${p.offset} attempt ${p.attempt}`)
      const target = base
      setTimeout(
        () => {
          if (out.get(p.key) === p.offset) out.delete(p.key)
          note(p.key, `ack sent ${p.offset} attempt ${p.attempt}`)
          const sent = sends++
          call(target, 'POST', '/v1/groups/g/acks', { deliveryIds: [p.deliveryId] })
            .then((r) => {
              note(p.key, `ack answered ${p.offset} attempt ${p.attempt}: ${r.status} ${r.json?.results?.[0]?.status}`)
              if (r.status !== 200 || r.json.results[0].status !== 'acked') return
              acked.set(p.key, [...(acked.get(p.key) ?? []), { offset: p.offset, sent }])
            })
            .catch((err: Error) => note(p.key, `ack failed ${p.offset}: ${err.message}`)) // the broker was killed: this ack's outcome is unknown, the message comes again
        },
        5 + Math.floor(Math.random() * 20),
      )
      return { status: 200 }
    })

    t.equal((await call(base, 'PUT', '/v1/topics/k', { partitions: 1 })).status, 201)
    t.equal(
      (await call(base, 'PUT', '/v1/groups/g', { topic: 'k', ordering: 'key', ackTimeoutMs: 3000, pushTimeoutMs: 2000, maxInFlight: 20 }))
        .status,
      201,
    )
    t.equal((await call(base, 'POST', '/v1/groups/g/consumers', { url: receiver.url })).status, 201)
    const KEYS = 8
    const TOTAL = 400
    for (let i = 0; i < TOTAL; i += 50) {
      const res = await call(base, 'POST', '/v1/topics/k/messages', {
        messages: Array.from({ length: 50 }, (_, j) => ({ key: `k${(i + j) % KEYS}`, value: i + j })),
      })
      t.equal(res.status, 201)
    }
    const total = () => [...acked.values()].reduce((n, a) => n + a.length, 0)
    await waitUntil(() => total() >= 100, 30_000, '100 acks before the kill')
    for (const key of events.keys()) note(key, 'SIGKILL')
    broker.child.kill('SIGKILL')
    t.equal(await broker.exited, 'SIGKILL')
    // The pushes out at the kill were never acked: after the restart they come again.
    out.clear()
    generation = 2
    broker = await spawnBroker(env)
    base = broker.url
    await waitUntil(
      async () => {
        const s = await call(base, 'GET', '/v1/groups/g')
        return s.status === 200 && s.json.partitions[0].lag === 0
      },
      60_000,
      'everything completed after the restart',
    )

    t.same(overlaps, [], 'never two messages of a key outstanding')
    for (let k = 0; k < KEYS; k++) {
      const offsets = [...(acked.get(`k${k}`) ?? [])].sort((a, b) => a.sent - b.sent).map((a) => a.offset)
      const inOrder = t.same(
        offsets,
        [...offsets].sort((a, b) => a - b),
        `k${k}: acked in offset order`,
      )
      if (!inOrder) t.comment(`k${k}'s history:\n${(events.get(`k${k}`) ?? []).join('\n')}`)
      t.equal(new Set(offsets).size, offsets.length, `k${k}: no message acked twice`)
    }
  },
)

t.test(
  'partitions moving between processes keep one message per key outstanding',
  { skip: databaseServerUrl ? false : 'needs a PostgreSQL server (set DATABASE_URL)' },
  async (t) => {
    const env = { DATABASE_URL: (await testDatabase(t)).url, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }
    const spawn = brokerSpawner(t, env)
    const [a, b] = (await Promise.all([spawn(), spawn()])) as [BrokerProcess, BrokerProcess]

    // Auto mode: a push is outstanding until it is answered (20 ms here); a push of a key arriving
    // while another offset of that key is still unanswered breaks the rule.
    const overlaps: string[] = []
    const receiver = await startReceiver(t, (req: Received) => {
      const p = req.json as { key: string; offset: number; partition: number }
      const open = receiver.requests.filter(
        (q) => q !== req && !q.closed && (q.json as typeof p).key === p.key && (q.json as typeof p).offset !== p.offset,
      )
      if (open.length > 0)
        overlaps.push(`${p.key}@${p.partition}/${p.offset} while ${open.map((q) => (q.json as typeof p).offset).join(',')} open`)
      return { status: 200, delayMs: 20 }
    })
    t.equal((await call(a.url, 'PUT', '/v1/topics/mk', { partitions: 6 })).status, 201)
    t.equal((await call(a.url, 'PUT', '/v1/groups/mk-g', { topic: 'mk', ackMode: 'auto', ordering: 'key', maxInFlight: 50 })).status, 201)
    t.equal((await call(a.url, 'POST', '/v1/groups/mk-g/consumers', { url: receiver.url })).status, 201)
    const produce = async (from: number, n: number) =>
      t.equal(
        (
          await call(a.url, 'POST', '/v1/topics/mk/messages', {
            messages: Array.from({ length: n }, (_, i) => ({ key: `k${(from + i) % 24}`, value: from + i })),
          })
        ).status,
        201,
      )

    await produce(0, 200)
    const d = await spawn() // partitions move to the newcomer while messages flow
    for (let i = 1; i <= 4; i++) {
      await produce(i * 200, 200)
      await new Promise((r) => setTimeout(r, 100))
    }
    b.child.kill('SIGTERM') // and a leaver hands its partitions over
    t.equal(await b.exited, 0)
    await produce(1000, 200)
    await waitUntil(
      async () => (await call(d.url, 'GET', '/v1/groups/mk-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
      60_000,
      'lag 0',
    )

    t.same(overlaps, [], 'never two messages of a key outstanding, across the handovers')
    const firsts = new Map<string, number[]>()
    const seen = new Set<string>()
    for (const r of receiver.requests) {
      const p = r.json as { key: string; offset: number; partition: number }
      if (seen.has(`${p.partition}/${p.offset}`)) continue
      seen.add(`${p.partition}/${p.offset}`)
      firsts.set(p.key, [...(firsts.get(p.key) ?? []), p.offset])
    }
    t.equal(seen.size, 1200, 'every message pushed')
    t.ok(
      [...firsts.values()].every((o) => o.every((x, i) => i === 0 || x > o[i - 1]!)),
      'each key first pushed in offset order',
    )
  },
)

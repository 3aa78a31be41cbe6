/**
 * Acks of pushes whose owner was SIGKILLed before it wrote their attempt rows (a push's row waits up
 * to a second for its outcome) are answered, not 503 (issue 29 item 3: at a kill, nearly every ack
 * call answered 503 was one of these, and the caller sent the same ids again, 503 each time, until
 * a survivor had taken the partition). Nobody holds the partition and no row names the id:
 * `unknown`, as the next owner answers once it has loaded the partition (it looks for the same
 * row), and the message is pushed again, nothing lost; an id whose row was written is acked. a polls
 * every 60 s (the longest allowed), so it keeps both partitions from its start to its death; b
 * polls every second: it still sees a as their owner when the acks come.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('acks of pushes whose owner was killed before writing their rows are answered, not 503', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c0 = new pg.Client({ connectionString: db.url })
  await c0.connect()
  t.teardown(() => c0.end())
  const spawnWith = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4' }, 120_000)
  const spawn = (pollMs: number) => spawnWith({ HOOKQ_CLUSTER_POLL_MS: String(pollMs) })
  const a = await spawn(60_000)
  const receiver = await startReceiver(t)
  t.equal((await call(a.url, 'PUT', '/v1/topics/ok', { partitions: 2 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/ok-g', { topic: 'ok', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/ok-g/consumers', { url: receiver.url })).status, 201)
  const b = await spawn(1000)

  type Push = { deliveryId: string; partition: number; offset: number; attempt: number }
  const messages = Array.from({ length: 6 }, (_, i) => ({ value: i, partition: i % 2 }))
  t.equal((await call(a.url, 'POST', '/v1/topics/ok/messages', { messages })).status, 201)
  const first = (await receiver.waitFor(6, 30_000)).map((r) => r.json as Push)
  a.child.kill('SIGKILL')
  await a.exited
  // Rows a wrote before it died (none, as a rule: it holds them a second for their outcome) are acked
  // here durably; those it did not are the case at hand.
  const rows = new Set(
    (await c0.query('SELECT id FROM deliveries WHERE id = ANY($1)', [first.map((p) => p.deliveryId)])).rows.map(
      (r: { id: string }) => r.id,
    ),
  )
  t.comment(`attempt rows a wrote before it died: ${rows.size} of ${first.length}`)

  const res = await call(b.url, 'POST', '/v1/groups/ok-g/acks', { deliveryIds: first.map((p) => p.deliveryId) })
  if (res.status !== 200) t.comment(JSON.stringify(res.json))
  t.equal(res.status, 200, 'the acks answered 200, not 503')
  const statuses = new Map((res.json?.results ?? []).map((r: { deliveryId: string; status: string }) => [r.deliveryId, r.status]))
  for (const p of first) {
    const status = statuses.get(p.deliveryId)
    if (rows.has(p.deliveryId)) t.equal(status, 'acked', `offset ${p.partition}:${p.offset}: its row was written, so its ack was`)
    else t.equal(status, 'unknown', `offset ${p.partition}:${p.offset}: no row, the next owner cannot tell it (it pushes it again)`)
  }

  // Nothing is lost: each message not acked is pushed again by b, and acked through it.
  const again = await waitUntil(
    () => {
      const latest = new Map<string, Push>()
      for (const r of receiver.requests.slice(first.length)) {
        const m = r.json as Push
        latest.set(`${m.partition}:${m.offset}`, m)
      }
      const wanted = first.filter((p) => statuses.get(p.deliveryId) !== 'acked')
      return wanted.every((p) => latest.has(`${p.partition}:${p.offset}`))
        ? wanted.map((p) => latest.get(`${p.partition}:${p.offset}`)!)
        : undefined
    },
    30_000,
    'b pushed again every message not acked',
  )
  if (again.length > 0) {
    const res2 = await call(b.url, 'POST', '/v1/groups/ok-g/acks', { deliveryIds: again.map((p) => p.deliveryId) })
    t.equal(res2.status, 200)
    t.same(new Set(res2.json.results.map((r: { status: string }) => r.status)), new Set(['acked']), 'the pushes again acked')
  }
  await waitUntil(
    async () => (await call(b.url, 'GET', '/v1/groups/ok-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
    30_000,
    'lag 0 on both partitions',
  )
})

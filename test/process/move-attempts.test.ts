/**
 * Attempt numbers across partition moves: processes join and leave while an explicit-ack group is
 * under load, and every message's pushes, whichever process made them, are attempts 1, 2, 3, ...
 * in the order they arrive: none repeated, none skipped, none going back. (Issue 29 saw a message
 * pushed as attempt 2 then as attempt 1 while processes joined, and another pushed as attempt 2
 * with no attempt 1 anywhere.)
 *
 * The consumer acks a message only at its (offset mod 3) + 1th push; an earlier push it nacks
 * (odd attempts) or lets its ack deadline pass (even ones), so messages are retried across owners.
 * Each ack or nack is sent to any live process and sent again on 503 (a partition moving), as a
 * client would.
 */
import pg from 'pg'
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const PARTITIONS = 8
const TOTAL = 240

t.test('attempt numbers rise by one per push of a message while partitions move', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const spawn = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4' })
  const live: BrokerProcess[] = [await spawn()]

  const pushes = new Map<number, number[]>()
  const calls: { offset: number; id: string; verb: 'acks' | 'nacks' }[] = []
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { offset: number; attempt: number; deliveryId: string; partition: number }
    const offset = env.partition * 1_000_000 + env.offset
    pushes.set(offset, [...(pushes.get(offset) ?? []), env.attempt])
    if (env.attempt >= (env.offset % 3) + 1) calls.push({ offset, id: env.deliveryId, verb: 'acks' })
    else if (env.attempt % 2 === 1) calls.push({ offset, id: env.deliveryId, verb: 'nacks' })
    return { status: 200 }
  })
  const a = live[0]!
  t.equal((await call(a.url, 'PUT', '/v1/topics/mv', { partitions: PARTITIONS })).status, 201)
  t.equal(
    (
      await call(a.url, 'PUT', '/v1/groups/mv-g', {
        topic: 'mv',
        ackMode: 'explicit',
        ackTimeoutMs: 1000,
        maxDeliveries: 100,
        maxInFlight: 50,
        retry: { initialDelayMs: 50, multiplier: 1, maxDelayMs: 50, jitter: 0 },
      })
    ).status,
    201,
  )
  t.equal((await call(a.url, 'POST', '/v1/groups/mv-g/consumers', { url: receiver.url })).status, 201)

  // Acks and nacks go to the live processes in turn, each sent again until answered (503: its partition is moving).
  const acked = new Set<number>()
  let acking = true
  let turn = 0
  const acker = (async () => {
    while (acking) {
      for (const verb of ['acks', 'nacks'] as const) {
        const batch = calls.filter((c) => c.verb === verb)
        for (let tries = 0; batch.length > 0 && acking && tries < 100; tries++) {
          const via = live[turn++ % live.length]!
          const body = { deliveryIds: batch.map((x) => x.id), ...(verb === 'nacks' ? { delayMs: 0 } : {}) }
          const res = await call(via.url, 'POST', `/v1/groups/mv-g/${verb}`, body).catch(() => undefined)
          if (res?.status !== 200) continue
          res.json.results.forEach((r: { status: string }, i: number) => {
            if (verb === 'acks' && (r.status === 'acked' || r.status === 'already_completed')) acked.add(batch[i]!.offset)
          })
          for (const c of batch) calls.splice(calls.indexOf(c), 1)
          batch.length = 0
        }
      }
      await new Promise((r) => setTimeout(r, 20))
    }
  })()
  let produced = 0
  const produce = async (n: number) => {
    const via = live[produced % live.length]!
    const res = await call(via.url, 'POST', '/v1/topics/mv/messages', {
      messages: Array.from({ length: n }, (_, i) => ({ key: `k${produced + i}`, value: produced + i })),
    })
    t.equal(res.status, 201, 'produced')
    produced += n
  }

  // Processes join one by one and one leaves (gracefully) while messages flow: partitions move each time.
  await produce(40)
  live.push(await spawn())
  await produce(40)
  live.push(await spawn())
  await produce(40)
  await produce(40)
  const leaving = live.splice(0, 1)[0]!
  leaving.child.kill('SIGTERM')
  t.equal(await leaving.exited, 0, 'the leaving process exits 0')
  await produce(40)
  live.push(await spawn())
  await produce(40)
  t.equal(produced, TOTAL)

  await waitUntil(() => acked.size === TOTAL, 90_000, 'every message acked', 100)
  acking = false
  await acker

  // A push whose answer never came (its timeout passed: 1 s here) may never have reached the
  // receiver's handler on a loaded machine: the receiver then misses that number although the
  // attempt was made (CI23: 1,3 with attempt 2 in the log, "no answer within 1000 ms"). Such an
  // attempt, and only such, may be missing from what the receiver saw; the rest must be 1, 2, 3, ...
  const client = new pg.Client({ connectionString: db.url })
  await client.connect()
  const unanswered = new Set(
    (
      await client.query<{ at: string }>(
        `SELECT (d.partition * 1000000 + d."offset")::text || ':' || d.attempt AS at FROM deliveries d
         JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = 'mv-g' AND d.status_code IS NULL AND d.outcome IN ('failed', 'timed_out')`,
      )
    ).rows.map((r) => r.at),
  )
  await client.end()
  const wrong = [...pushes]
    .filter(([o, attempts]) => {
      let next = 1
      for (const n of attempts) {
        while (n > next && unanswered.has(`${o}:${next}`)) next++
        if (n !== next) return true
        next++
      }
      return false
    })
    .map(([o, attempts]) => `partition ${Math.floor(o / 1_000_000)} offset ${o % 1_000_000}: ${attempts.join(',')}`)
  t.same(wrong, [], 'each message was pushed as attempt 1, 2, 3, ... in that order, whichever process pushed it')
  t.equal(pushes.size, TOTAL, 'every message was pushed')
})

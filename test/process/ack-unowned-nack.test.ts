/**
 * Nacks and extends of a partition that no process holds (handed over by one process, not yet taken
 * by the next) are written durably by the process they reach, like acks (ack-unowned.test.ts), not
 * answered 503 (issue 29 item 3): on the rows of the attempts handed over in flight, which the next
 * owner reads. A nacked message goes again once its delay is over (0 here: at once); an extended
 * one keeps its new deadline. A dead-letter nack needs the owner (it produces the dead letter): 503.
 * The second process polls every 60 s (the longest allowed), so the partition it is to take stays
 * free meanwhile: its first poll comes early in its start, before it listens, and under load the
 * start alone took 30 s and more (a 30 s poll could come in the middle of the test).
 */
import t from 'tap'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { callBroker as call, spawnBroker, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'
import { parseDeliveryId } from '../../src/store/delivery-id.ts'
import { PARTITION_LOCK_BASE } from '../../src/store/membership.ts'

t.test(
  'nacks and extends of a partition nobody holds are written, not refused, and the next owner follows them',
  { skip: needsServer },
  async (t) => {
    const db = await testDatabase(t)
    const c = new pg.Client({ connectionString: db.url })
    await c.connect()
    t.teardown(() => c.end())
    const procs: BrokerProcess[] = []
    t.teardown(() => {
      for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL')
    })
    const spawn = async (pollMs: number) => {
      const p = await spawnBroker({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_CLUSTER_POLL_MS: String(pollMs) }, 120_000)
      procs.push(p)
      return p
    }
    // Partition locks only: a member also holds the outbox's wait lock, an advisory lock of the same kind.
    const held = async () =>
      (
        await c.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND mode = 'ExclusiveLock'
         AND classid::bigint >= $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          [PARTITION_LOCK_BASE],
        )
      ).rows[0].n as number

    const a = await spawn(200)
    const receiver = await startReceiver(t)
    t.equal((await call(a.url, 'PUT', '/v1/topics/nx', { partitions: 2 })).status, 201)
    t.equal((await call(a.url, 'PUT', '/v1/groups/nx-g', { topic: 'nx', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
    t.equal((await call(a.url, 'POST', '/v1/groups/nx-g/consumers', { url: receiver.url })).status, 201)
    const messages = Array.from({ length: 10 }, (_, i) => ({ key: `k${i}`, value: i }))
    t.equal((await call(a.url, 'POST', '/v1/topics/nx/messages', { messages })).status, 201)
    await receiver.waitFor(10, 30_000)

    // b joins: a hands b's share over at its next poll, b takes it only at its own, 60 s on.
    const b = await spawn(60_000)
    await waitUntil(async () => (await held()) === 1, 30_000, 'one partition held by a, the other by nobody')

    const lockOf = await c.query(
      `SELECT objid::int AS p FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND mode = 'ExclusiveLock'
       AND classid::bigint >= $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      [PARTITION_LOCK_BASE],
    )
    const free = 1 - (lockOf.rows[0].p as number)
    const ids = receiver.requests
      .map((r) => (r.json as { deliveryId: string }).deliveryId)
      .filter((id) => parseDeliveryId(id)!.partition === free)
    t.ok(ids.length >= 2, `messages on the free partition ${free}: ${ids.length}`)
    const nacked = ids.slice(0, Math.ceil(ids.length / 2))
    const extended = ids.slice(nacked.length)

    const dead = await call(b.url, 'POST', '/v1/groups/nx-g/nacks', { deliveryIds: [extended[0]], deadLetter: true })
    t.equal(dead.status, 503, 'a dead-letter nack waits for an owner (503, asked again)')
    const nack = await call(b.url, 'POST', '/v1/groups/nx-g/nacks', { deliveryIds: nacked, delayMs: 0 })
    t.equal(nack.status, 200, 'nacks through the joining process answered 200, not 503')
    t.same(
      nack.json.results.map((r: { status: string }) => r.status),
      nacked.map(() => 'nacked'),
      'every nack written',
    )
    const extend = await call(a.url, 'POST', '/v1/groups/nx-g/extend', { deliveryIds: extended, extendMs: 300_000 })
    t.equal(extend.status, 200, 'extends through the holder of the other partition answered 200, not 503')
    t.same(
      extend.json.results.map((r: { status: string }) => r.status),
      extended.map(() => 'extended'),
      'every extend written',
    )
    const rows = await c.query(
      `SELECT id, outcome::text, (extract(epoch from ack_deadline - now()))::float8 AS left_s FROM deliveries WHERE id = ANY($1)`,
      [ids],
    )
    for (const r of rows.rows) {
      if (nacked.includes(r.id)) t.equal(r.outcome, 'nacked', 'a nacked attempt is on record as nacked')
      else t.ok(r.left_s > 200, `an extended attempt's deadline moved (${Math.round(r.left_s)} s left)`)
    }
    t.equal(await held(), 1, 'the partition was still held by nobody')

    // b leaves; a takes everything again: the nacked messages go again at once (as attempt 2), the extended ones wait.
    const before = receiver.requests.length
    b.child.kill('SIGTERM')
    t.equal(await b.exited, 0)
    await waitUntil(async () => (await held()) === 2, 30_000, 'a holds both partitions')
    const again = () =>
      receiver.requests.slice(before).map((r) => r.json as { deliveryId: string; attempt: number; offset: number; partition: number })
    const offsetOf = (id: string) => parseDeliveryId(id)!.offset
    await waitUntil(() => again().length >= nacked.length, 30_000, 'the nacked messages pushed again')
    await absenceWindow(1000) // an extended message pushed again would come at once on taking the partition
    t.same(
      again()
        .map((p) => `${p.partition}:${p.offset}:${p.attempt}`)
        .sort(),
      nacked.map((id) => `${free}:${offsetOf(id)}:2`).sort(),
      'the nacked messages, and only those, pushed again as attempt 2',
    )
  },
)

/**
 * An ack of a partition that no process holds (handed over by one process, not yet taken by the
 * next) is written durably by the process it reaches, not answered 503 (issue 29: 2.6% of ack
 * calls were 503 while partitions moved), and the next owner does not push the acked message again.
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
import { PARTITION_LOCK_BASE } from '../../src/store/membership.ts'

t.test(
  'an ack of a partition nobody holds is written, not refused, and its message is not pushed again',
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
    t.equal((await call(a.url, 'PUT', '/v1/topics/un', { partitions: 2 })).status, 201)
    t.equal((await call(a.url, 'PUT', '/v1/groups/un-g', { topic: 'un', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
    t.equal((await call(a.url, 'POST', '/v1/groups/un-g/consumers', { url: receiver.url })).status, 201)
    const messages = Array.from({ length: 10 }, (_, i) => ({ key: `k${i}`, value: i }))
    t.equal((await call(a.url, 'POST', '/v1/topics/un/messages', { messages })).status, 201)
    await receiver.waitFor(10, 30_000)

    // b joins: a hands b's share over at its next poll, b takes it only at its own, 60 s on.
    const b = await spawn(60_000)
    await waitUntil(async () => (await held()) === 1, 30_000, 'one partition held by a, the other by nobody')

    const ids = receiver.requests.map((r) => (r.json as { deliveryId: string }).deliveryId)
    for (const via of [b, a]) {
      const res = await call(via.url, 'POST', '/v1/groups/un-g/acks', { deliveryIds: ids })
      if (res.status !== 200) t.comment(JSON.stringify(res.json))
      t.equal(res.status, 200, `acks through ${via === a ? 'the holder' : 'the joining process'} answered 200, not 503`)
      t.same(
        res.json.results.filter((r: { status: string }) => r.status !== 'acked' && r.status !== 'already_completed'),
        [],
        'every ack written',
      )
    }
    t.equal(await held(), 1, 'the partition was still held by nobody')

    // b leaves; a takes everything again, and finds the acks written.
    b.child.kill('SIGTERM')
    t.equal(await b.exited, 0)
    await waitUntil(async () => (await held()) === 2, 30_000, 'a holds both partitions')
    await waitUntil(
      async () => (await call(a.url, 'GET', '/v1/groups/un-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
      30_000,
      'lag 0',
    )
    await absenceWindow(1000) // a push of an acked message would come at once on taking the partition
    t.equal(receiver.requests.length, 10, 'no acked message was pushed again')
  },
)

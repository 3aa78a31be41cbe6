/**
 * An ack, a nack or an extend reaching a process whose view of the owners is stale (its last poll
 * saw an owner that has since been killed, and another process has taken the partition) goes to the
 * partition's holder found afresh, not answered 503 (issue 29: most 503s on acks after a SIGKILL were
 * "did not answer" or "moving" from a view up to a poll old). c polls every 60 s (the longest allowed),
 * so its view stays stale, as a rule: under load its next poll may come first, and then the calls
 * reach d all the same (the test waits on what d holds, not on c's view).
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'
import { PARTITION_LOCK_BASE } from '../../src/store/membership.ts'

t.test('acks, nacks and extends through a process with a stale view reach the new holder', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c0 = new pg.Client({ connectionString: db.url })
  await c0.connect()
  t.teardown(() => c0.end())
  const spawnWith = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4' }, 120_000)
  const spawn = (pollMs: number) => spawnWith({ HOOKQ_CLUSTER_POLL_MS: String(pollMs) })
  // The partitions whose locks the member session of the process at `url` holds.
  const heldBy = async (url: string) =>
    (
      await c0.query(
        `SELECT l.objid::int AS p FROM pg_locks l JOIN broker_members m ON m.backend_pid = l.pid
         WHERE m.url = $1 AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock'
           AND l.classid::bigint >= $2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        [url, PARTITION_LOCK_BASE],
      )
    ).rows.map((r: { p: number }) => r.p)

  const a = await spawn(200)
  const receiver = await startReceiver(t)
  t.equal((await call(a.url, 'PUT', '/v1/topics/sv', { partitions: 2 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/sv-g', { topic: 'sv', ackMode: 'explicit', ackTimeoutMs: 60_000 })).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/sv-g/consumers', { url: receiver.url })).status, 201)
  const messages = Array.from({ length: 10 }, (_, i) => ({ key: `k${i}`, value: i }))
  t.equal((await call(a.url, 'POST', '/v1/topics/sv/messages', { messages })).status, 201)
  await receiver.waitFor(10, 30_000)
  // a writes the row of a push awaiting its ack a second after the push: the acks at the end, through
  // c, find the deliveries of a partition nobody holds by their rows, so they must be written before a dies.
  await waitUntil(
    async () => (await c0.query('SELECT count(DISTINCT (partition, "offset"))::int AS n FROM deliveries')).rows[0].n === 10,
    30_000,
    "a's attempt rows written",
  )

  // c sees a holding both partitions, and keeps that view; a dies; d takes its share (one partition).
  // a may hand c's share over before it dies (it polls every 200 ms, c's start takes longer under
  // load): that partition stays free until c's next poll, and d may take it.
  const c = await spawn(60_000)
  a.child.kill('SIGKILL')
  await a.exited
  const d = await spawn(200)
  // Read from d's own locks: should c's next poll come before d joins (a slow start), c takes both
  // and hands d its share at the poll after, up to 60 s on.
  const dPartition = (
    await waitUntil(
      async () => {
        const held = await heldBy(d.url)
        return held.length === 1 ? { p: held[0]! } : undefined
      },
      90_000,
      'd holds one partition',
    )
  ).p

  // Extends and nacks of d's partition through c reach d (a nack or extend of a partition nobody
  // holds has nowhere to go but a retry: c's own share stays unclaimed until c's next poll).
  // The deliveries d holds in flight now: the old owner's, if it handed the partition over before it
  // died (d takes them on as its attempts in flight: their rows stay in flight, with their ack
  // deadlines), or d's own second attempts, if a had it when it crashed (pushed again at once).
  const count = (
    await c0.query('SELECT count(*)::int AS n FROM messages m JOIN topics t ON t.id = m.topic_id WHERE t.name = $1 AND m.partition = $2', [
      'sv',
      dPartition,
    ])
  ).rows[0].n as number
  t.ok(count > 0, 'some messages are of the partition d took')
  type Push = { deliveryId: string; partition: number; offset: number; attempt: number }
  const heldByD = async (): Promise<{ id: string; offset: number; attempt: number }[]> => {
    // d's status first: once it counts them all in flight, the rows its load abandoned are marked so.
    const status = (await call(d.url, 'GET', '/v1/groups/sv-g')).json
    if (status.partitions[dPartition].inFlight !== count) throw new Error(`d's status: ${JSON.stringify(status.partitions)}`)
    const rows = (
      await c0.query(`SELECT id, "offset"::int AS offset, attempt FROM deliveries WHERE partition = $1 AND outcome = 'in_flight'`, [
        dPartition,
      ])
    ).rows as { id: string; offset: number; attempt: number }[]
    const latest = new Map<number, Push>()
    for (const r of receiver.requests) {
      const m = r.json as Push
      if (m.partition === dPartition && m.attempt >= 2 && (latest.get(m.offset)?.attempt ?? 0) < m.attempt) latest.set(m.offset, m)
    }
    const held =
      rows.length === count ? rows : [...latest.values()].map((m) => ({ id: m.deliveryId, offset: m.offset, attempt: m.attempt }))
    if (held.length !== count)
      throw new Error(`rows in flight ${JSON.stringify(rows)}, pushes again ${JSON.stringify([...latest.values()])}`)
    return held
  }
  const held = await waitUntil(heldByD, 30_000, 'd holds its partition in flight')
  const onD = held.map((r) => r.id)
  const extended = await call(c.url, 'POST', '/v1/groups/sv-g/extend', { deliveryIds: onD, extendMs: 30_000 })
  t.equal(extended.status, 200, 'extends through the process with a stale view answered 200, not 503')
  t.same(new Set(extended.json.results.map((r: { status: string }) => r.status)), new Set(['extended']), 'every extend applied by d')
  const nacked = await call(c.url, 'POST', '/v1/groups/sv-g/nacks', { deliveryIds: onD.slice(0, 1), delayMs: 0 })
  t.equal(nacked.status, 200, 'a nack through the process with a stale view answered 200, not 503')
  t.equal(nacked.json.results[0].status, 'nacked', 'the nack applied by d')
  // The nacked message comes again, with the next attempt number, from d.
  const again = { offset: held[0]!.offset, attempt: held[0]!.attempt + 1 }
  await waitUntil(
    () =>
      receiver.requests.some((r) => {
        const m = r.json as { partition: number; offset: number; attempt: number }
        return m.partition === dPartition && m.offset === again.offset && m.attempt === again.attempt
      }),
    30_000,
    'the nacked message pushed again',
  )

  // Every message's latest delivery acked through c (those of c's own, unclaimed share are written there).
  const latest = (
    await c0.query(`SELECT DISTINCT ON (partition, "offset") id FROM deliveries ORDER BY partition, "offset", attempt DESC`)
  ).rows.map((r: { id: string }) => r.id)
  const res = await call(c.url, 'POST', '/v1/groups/sv-g/acks', { deliveryIds: latest })
  if (res.status !== 200) t.comment(JSON.stringify(res.json))
  t.equal(res.status, 200, 'acks through the process with a stale view answered 200, not 503')
  t.same(
    res.json.results.filter((r: { status: string }) => r.status !== 'acked' && r.status !== 'already_completed'),
    [],
    'every ack written',
  )
  await waitUntil(
    async () => (await call(d.url, 'GET', '/v1/groups/sv-g')).json.partitions.every((p: { lag: number }) => p.lag === 0),
    30_000,
    'lag 0',
  )
})

/**
 * Pull delivery across two broker processes on one database: a pull on one process leases from
 * the partitions the other owns, a long poll on one is woken by a produce on the other, and leases
 * made by a process killed with SIGKILL come back (attempt 2) from the process that takes over.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { type BrokerProcess, brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'
import { PARTITION_LOCK_BASE } from '../../src/store/membership.ts'

interface Pulled {
  deliveryId: string
  partition: number
  offset: number
  value: unknown
  attempt: number
}

t.test('pull across two broker processes', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())
  const spawn = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_CLUSTER_POLL_MS: '200' }, 120_000)
  /** Processes (backend pids) holding partition locks, and how many each. */
  const holders = async () =>
    (
      await c.query(
        `SELECT pid, count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND mode = 'ExclusiveLock'
         AND classid::bigint >= $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY pid`,
        [PARTITION_LOCK_BASE],
      )
    ).rows as { pid: number; n: number }[]
  const pull = async (via: BrokerProcess, body: Record<string, unknown>): Promise<Pulled[]> => {
    const res = await call(via.url, 'POST', '/v1/groups/pl/pull', body, {}, 60_000)
    if (res.status !== 200) throw new Error(`pull ${res.status}: ${JSON.stringify(res.json)}`)
    return res.json.messages as Pulled[]
  }

  const a = await spawn()
  const b = await spawn()
  t.equal((await call(a.url, 'PUT', '/v1/topics/pt', { partitions: 4 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/pl', { topic: 'pt', delivery: 'pull', ackTimeoutMs: 120_000 })).status, 201)
  await waitUntil(
    async () => {
      const h = await holders()
      return h.length === 2 && h.reduce((n, r) => n + r.n, 0) === 4
    },
    60_000,
    'the four partitions shared by the two processes',
  )

  // A long poll on a, woken by a produce on b, whichever process owns the partition. (Four locks on
  // two holders may be a 3/1 split on its way to 2/2: a partition may move during a long poll, which
  // gathers again from the owners as they are then; test/process/pull-move shows that case alone.)
  const woken: Pulled[] = []
  for (const partition of [0, 1, 2, 3]) {
    const waiting = pull(a, { waitMs: 20_000, maxMessages: 1 })
    await waitUntil(
      async () =>
        (await call(b.url, 'POST', '/v1/topics/pt/messages', { messages: [{ value: `w${partition}`, partition }] })).status === 201,
    )
    const got = await waiting
    woken.push(...got)
  }
  t.same(
    woken.map((m) => m.value),
    ['w0', 'w1', 'w2', 'w3'],
    'every partition leased through a: those b owns too',
  )
  const ack = await call(a.url, 'POST', '/v1/groups/pl/acks', { deliveryIds: woken.map((m) => m.deliveryId) })
  t.same(
    ack.json.results.map((r: { status: string }) => r.status),
    ['acked', 'acked', 'acked', 'acked'],
  )

  // One message per partition, leased through b for 15 s and not acked. (A lease that passed before
  // the last of the four was taken would come back as attempt 2 in `leased`: at 3 s, a loaded
  // machine's few pulls could outlast it.)
  await call(a.url, 'POST', '/v1/topics/pt/messages', { messages: [0, 1, 2, 3].map((p) => ({ value: `k${p}`, partition: p })) })
  const leased: Pulled[] = []
  await waitUntil(
    async () => {
      leased.push(...(await pull(b, { leaseMs: 15_000 })))
      return leased.length >= 4
    },
    60_000,
    'four leases through b',
  )
  t.same(
    leased.map((m) => m.attempt),
    [1, 1, 1, 1],
  )
  // Then the leases are made to end soon (extend sets the deadline to now + extendMs), so the test
  // does not wait out 15 s; b is killed once the new deadlines are in the attempt log, where the
  // process taking b's partitions over reads when each lease ends.
  const ids = leased.map((m) => m.deliveryId)
  const extended = await call(b.url, 'POST', '/v1/groups/pl/extend', { deliveryIds: ids, extendMs: 1000 })
  t.same(
    extended.json.results.map((r: { status: string }) => r.status),
    ['extended', 'extended', 'extended', 'extended'],
  )
  await waitUntil(
    async () =>
      (
        await c.query(`SELECT count(*)::int AS n FROM deliveries WHERE id = ANY($1) AND ack_deadline < now() + interval '10 seconds'`, [
          ids,
        ])
      ).rows[0].n === ids.length,
    30_000,
    'the shortened deadlines in the attempt log',
  )
  b.child.kill('SIGKILL')
  await b.exited
  // a takes b's partitions over; every lease ends without an ack and comes back as attempt 2 through a.
  const again = new Map<number, Pulled>()
  await waitUntil(
    async () => {
      for (const m of await pull(a, { waitMs: 2000 })) again.set(m.partition, m)
      return again.size === 4
    },
    90_000,
    'the four messages again through a',
  )
  t.same(
    [...again.values()].sort((x, y) => x.partition - y.partition).map((m) => [m.value, m.attempt]),
    [
      ['k0', 2],
      ['k1', 2],
      ['k2', 2],
      ['k3', 2],
    ],
    'leased again with the next attempt number, after the owner was killed',
  )
})

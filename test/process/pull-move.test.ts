/**
 * A long poll whose group's partition moves while it waits: the poll answers with a message
 * produced there after the move, not empty at waitMs (contract "Pull delivery": a long poll answers
 * as soon as a message can be leased).
 *
 * Three broker processes share a topic of two partitions, so one process, x, owns none. A long poll
 * on x gathers from the two owners (its own partitions, none, are not probed). One owner is killed;
 * its partition goes to x (the plan gives a freed partition to the member under its share), and a
 * message is produced to it. The gather's owners were read when the poll came: it went on probing
 * the dead owner and the other one, never x itself, and answered empty after 20 s (the flaky
 * test/process/pull-processes long poll was this: its partition moved between the two processes
 * while a's view of the owners, read at the pull, left out the one that held it).
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { type BrokerProcess, brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'
import { PARTITION_LOCK_BASE } from '../../src/store/membership.ts'

t.test('a long poll woken on the process its partition moved to', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())
  const spawn = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '3', HOOKQ_CLUSTER_POLL_MS: '200' }, 120_000)
  /** Each held partition's holder, by its advertised URL. */
  const holders = async () =>
    new Map(
      (
        await c.query(
          `SELECT l.objid::int AS partition, m.url FROM pg_locks l JOIN broker_members m ON m.backend_pid = l.pid
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.classid::bigint >= $1
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          [PARTITION_LOCK_BASE],
        )
      ).rows.map((r: { partition: number; url: string }) => [r.partition, r.url] as const),
    )
  const waitingOn = async (p: BrokerProcess) =>
    Number(/^hookq_pulls_waiting (\d+)$/m.exec(String((await call(p.url, 'GET', '/metrics')).json))?.[1] ?? -1)

  const procs = [await spawn(), await spawn(), await spawn()]
  const [first] = procs as [BrokerProcess]
  t.equal((await call(first.url, 'PUT', '/v1/topics/mt', { partitions: 2 })).status, 201)
  t.equal((await call(first.url, 'PUT', '/v1/groups/mg', { topic: 'mt', delivery: 'pull', ackTimeoutMs: 120_000 })).status, 201)
  // Both partitions held, by two processes (with three members, each owns at most one).
  const held = await waitUntil(
    async () => {
      const h = await holders()
      return h.size === 2 && new Set(h.values()).size === 2 ? h : null
    },
    60_000,
    'the two partitions held by two processes',
  )
  const x = procs.find((p) => ![...held.values()].includes(p.url))!
  const [victim, other] = [0, 1].map((partition) => procs.find((p) => p.url === held.get(partition))!) as [BrokerProcess, BrokerProcess]
  t.ok(x && victim && other, 'x owns no partition')

  const waiting = call(x.url, 'POST', '/v1/groups/mg/pull', { waitMs: 20_000, maxMessages: 1 }, {}, 60_000)
  // Probing both owners: x's gather read them, so it waits on them (and not on itself, which owns nothing).
  await waitUntil(
    async () => (await waitingOn(victim)) === 1 && (await waitingOn(other)) === 1,
    30_000,
    'the long poll on x probing both owners',
  )
  victim.child.kill('SIGKILL')
  await victim.exited
  await waitUntil(async () => (await holders()).get(0) === x.url, 60_000, 'partition 0 taken over by x')
  t.equal((await call(other.url, 'POST', '/v1/topics/mt/messages', { messages: [{ value: 'moved', partition: 0 }] })).status, 201)
  const res = await waiting
  t.equal(res.status, 200)
  t.same(
    (res.json.messages as { value: unknown }[]).map((m) => m.value),
    ['moved'],
    'the long poll answered with the message of the partition that moved to x',
  )
})

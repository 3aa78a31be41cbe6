/**
 * A process stopped past its session's end must push nothing when it resumes (issue 29 item 2: a
 * message pushed as attempt 2, then as attempt 1). The owner of a one-partition group has reserved
 * its messages and gathers them into a batch (maxWaitMs 10 s) when it is stopped (SIGSTOP): the
 * server ends its silent session, the other process takes the partition and pushes them (as
 * attempt 2: it counts the reserved attempt 1 it cannot know was never sent). When the stopped
 * process resumes, its batch timer is long due, before it has read that its session is gone: its
 * lease (src/cluster/ownership.ts) has lapsed, so the batch waits for the next poll, which fails,
 * and goes nowhere.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { MEMBERS_LOCK_KEY } from '../../src/store/membership.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const MESSAGES = 20

/** Partitions a process says it owns (hookq_partitions_owned); throws when it does not answer. */
async function owned(b: BrokerProcess): Promise<number> {
  const text = String((await call(b.url, 'GET', '/metrics', undefined, {}, 5000)).json)
  return Number(/^hookq_partitions_owned (\d+)$/m.exec(text)?.[1] ?? -1)
}

t.test('a process stopped past its session pushes nothing when it resumes', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const env = { DATABASE_URL: db.url, HOOKQ_CLUSTER_POLL_MS: '200', HOOKQ_DB_POOL_SIZE: '4' }
  const procs: BrokerProcess[] = []
  t.teardown(() => {
    for (const b of procs) {
      b.child.kill('SIGCONT')
      if (b.child.exitCode === null) b.child.kill('SIGKILL')
    }
  })
  const [a, b] = await Promise.all([spawnBroker(env), spawnBroker(env)])
  procs.push(a, b)
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())

  // Each push as it arrives: the attempt of each message it carries (offset → attempts in arrival order).
  const receiver = await startReceiver(t)
  const attemptsOf = () => {
    const out = new Map<number, number[]>()
    for (const r of receiver.requests) {
      for (const d of (r.json as { deliveries: { offset: number; attempt: number }[] }).deliveries)
        out.set(d.offset, [...(out.get(d.offset) ?? []), d.attempt])
    }
    return out
  }
  const delivered = () => [...attemptsOf().values()].reduce((n, x) => n + x.length, 0)

  t.equal((await call(a.url, 'PUT', '/v1/topics/stall', { partitions: 1 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/stall-g', { topic: 'stall', batch: { maxMessages: 1000, maxWaitMs: 10_000 } })).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/stall-g/consumers', { url: receiver.url })).status, 201)
  await waitUntil(async () => (await owned(a)) + (await owned(b)) === 1, 30_000, 'one process owns the partition')
  const [victim, other] = (await owned(a)) === 1 ? [a, b] : [b, a]

  // The owner reserves the messages (attempt 1 on record) and gathers them into its batch.
  t.equal(
    (
      await call(victim.url, 'POST', '/v1/topics/stall/messages', {
        messages: Array.from({ length: MESSAGES }, (_, i) => ({ value: i })),
      })
    ).status,
    201,
  )
  await waitUntil(
    async () => {
      const { rows } = await c.query(
        `SELECT o.pushed_offset - o.committed_offset AS n FROM group_offsets o JOIN consumer_groups g ON g.id = o.group_id WHERE g.name = 'stall-g'`,
      )
      return Number(rows[0]?.n) >= MESSAGES
    },
    30_000,
    'the owner reserved every message',
    20,
  )
  victim.child.kill('SIGSTOP')
  t.equal(receiver.requests.length, 0, 'stopped while its batch was gathering')

  // Its session ends (idle_session_timeout, about 4 s here) and the other process pushes the messages.
  await waitUntil(() => delivered() >= MESSAGES, 90_000, 'the other process pushes every message', 100)
  const beforeResume = receiver.requests.length

  victim.child.kill('SIGCONT')
  await waitUntil(async () => (await owned(victim).catch(() => -1)) === 0, 30_000, 'the resumed process knows it owns nothing')
  // It joins again on a new session (its overdue timers have all run by then).
  await waitUntil(
    async () => {
      const { rows } = await c.query(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock' AND classid = 0 AND objid = $1
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        [MEMBERS_LOCK_KEY],
      )
      return rows[0].n === 2
    },
    30_000,
    'the resumed process is a member again',
  )
  // The ownership plan may hand the partition back to the resumed process (a group's one partition
  // is the share of the member next in turn after its id, and the rejoined session is a new member),
  // or leave it where it is: either way one process owns it once the cluster settles.
  await waitUntil(async () => (await owned(victim)) + (await owned(other)) === 1, 30_000, 'one process owns the partition again')

  const seen = attemptsOf()
  t.equal(seen.size, MESSAGES, 'every message was pushed')
  const wrong = [...seen].filter(([, xs]) => xs.some((n, i) => n !== xs[0]! + i)).map(([o, xs]) => `offset ${o}: ${xs.join(',')}`)
  t.same(wrong, [], 'each message was pushed as consecutive, rising attempt numbers (none going back)')
  t.equal(receiver.requests.length, beforeResume, 'the resumed process pushed nothing (its batch went nowhere)')
})

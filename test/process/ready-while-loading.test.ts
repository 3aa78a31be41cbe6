/**
 * A broker process serves the API as soon as it has joined the others, while its share of the
 * partitions is still loading (issue 29: restarted processes took 5-16 s to be ready, most of it
 * waiting for their partitions). The load is held up here by a row lock on the partition's offsets
 * (taking a partition bumps its owner epoch there): the process must listen and be ready meanwhile,
 * and push the partition once the lock is gone.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { callBroker as call, spawnBroker, type BrokerProcess } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('a process is ready while its partitions are still loading, and pushes them once loaded', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const procs: BrokerProcess[] = []
  t.teardown(() => {
    for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL')
  })
  const env = { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_CLUSTER_POLL_MS: '200' }
  const a = await spawnBroker(env, 120_000)
  procs.push(a)
  const receiver = await startReceiver(t)
  t.equal((await call(a.url, 'PUT', '/v1/topics/rl', { partitions: 1 })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/groups/rl-g', { topic: 'rl' })).status, 201)
  t.equal((await call(a.url, 'POST', '/v1/groups/rl-g/consumers', { url: receiver.url })).status, 201)
  a.child.kill('SIGTERM')
  t.equal(await a.exited, 0)

  // The partition's offsets row locked (until COMMIT, or c.end() at teardown): whoever takes the
  // partition waits at its epoch bump.
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())
  await c.query('BEGIN')
  t.equal(
    (await c.query(`SELECT 1 FROM group_offsets o JOIN consumer_groups g ON g.id = o.group_id WHERE g.name = 'rl-g' FOR UPDATE OF o`))
      .rowCount,
    1,
  )

  const starting = spawnBroker(env, 120_000)
  // Read on a connection of its own: a transaction sees one snapshot of pg_stat_activity.
  const watch = new pg.Client({ connectionString: db.url })
  await watch.connect()
  t.teardown(() => watch.end())
  const waiting = async () =>
    (
      await watch.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE group_offsets%'`,
      )
    ).rows[0].n === 1
  await waitUntil(waiting, 120_000, 'the new process waits to take the partition', 50)
  // Before: it listened only once its share was loaded, so not while the lock is held.
  const b = await starting
  procs.push(b)
  t.ok(await waiting(), 'it listens while the partition is still being taken')
  t.equal((await call(b.url, 'GET', '/readyz')).status, 200, 'and is ready')
  t.equal((await call(b.url, 'POST', '/v1/topics/rl/messages', { messages: [{ key: 'k', value: 1 }] })).status, 201, 'it takes produce')
  t.equal(receiver.requests.length, 0, 'nothing pushed while the partition is not loaded')

  await c.query('COMMIT')
  await receiver.waitFor(1, 60_000)
  t.equal((receiver.requests[0]!.json as { value: number }).value, 1, 'pushed once the partition is loaded')
})

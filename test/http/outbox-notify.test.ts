/**
 * The broker is woken by PostgreSQL when a hookq_produce() transaction commits (a trigger NOTIFYs,
 * the member session LISTENs), not by polling: with the backstop poll at a minute, a committed
 * message is still moved at once, and again after the member session was cut and joined anew.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('hookq_produce commits wake the broker; the backstop poll is not what moves them', { skip: needsServer }, async (t) => {
  const { broker, url } = await startListeningBroker(t, { HOOKQ_OUTBOX_POLL_MS: '60000', HOOKQ_CLUSTER_POLL_MS: '100' })
  const pool = new pg.Pool({ connectionString: broker.databaseUrl, max: 4 })
  t.teardown(() => pool.end())
  t.equal(
    (await fetch(`${url}/v1/topics/woken`, { method: 'PUT', body: '{"partitions":1}', headers: { 'content-type': 'application/json' } }))
      .status,
    201,
  )
  const values = async () => {
    const res = await fetch(`${url}/v1/topics/woken/partitions/0/messages`)
    return ((await res.json()) as { messages: { value: unknown }[] }).messages.map((m) => m.value)
  }
  // Well within the minute the poll would take (the broker's own start made its first look).
  const moved = (n: number, what: string) => waitUntil(async () => (await values()).length === n, 20_000, what)

  await pool.query(`SELECT hookq_produce('woken', '"first"')`)
  await moved(1, 'the first message to be moved on its notification')

  // Cut the member session (where the LISTEN lives): it joins again and listens again.
  const member = async () =>
    (
      await pool.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'hookq-member'`,
      )
    ).rows.map((r) => r.pid)
  const [before] = await member()
  t.ok(before, 'the member session is there')
  await pool.query('SELECT pg_terminate_backend($1)', [before])
  // A commit while the session is down is heard by no one: the rejoin looks for it.
  await pool.query(`SELECT hookq_produce('woken', '"while cut"')`)
  await waitUntil(async () => (await member()).some((pid) => pid !== before), 20_000, 'the member session to join again')
  await moved(2, 'the message committed while the session was down to be moved when it joined again')
  await pool.query(`SELECT hookq_produce('woken', '"after"')`)
  await moved(3, 'a message committed after the rejoin to be moved on its notification')
  t.same(await values(), ['first', 'while cut', 'after'])
})

// The wait lock (0x686b7157): while a commit holds it shared (a session stands in for one here,
// taken before the broker starts), the broker cannot take it to wait, so it keeps looking, and a
// commit skips its NOTIFY and is still moved. Once let go, the broker waits again, holding it, and
// a commit NOTIFYs.
t.test('a commit NOTIFYs only while a broker process waits', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const pool = new pg.Pool({ connectionString: db.url, max: 4 })
  pool.on('error', () => {})
  t.teardown(() => pool.end())
  const holder = await pool.connect()
  t.teardown(() => holder.release())
  // The test database is dropped WITH (FORCE) at teardown, which may end these sessions before they
  // are released: an error event then, expected, and not the test's (a CI run failed on it).
  holder.on('error', () => {})
  await holder.query('SELECT pg_advisory_lock_shared($1)', [0x686b7157])
  const broker = await createBroker(
    loadConfig({ DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', LOG_LEVEL: 'silent', HOOKQ_OUTBOX_POLL_MS: '60000' }),
  )
  t.teardown(() => broker.close())
  const url = await broker.app.listen({ host: '127.0.0.1', port: 0 })
  t.equal(
    (await fetch(`${url}/v1/topics/told`, { method: 'PUT', body: '{"partitions":1}', headers: { 'content-type': 'application/json' } }))
      .status,
    201,
  )
  const count = async () => {
    const res = await fetch(`${url}/v1/topics/told/partitions/0/messages`)
    return ((await res.json()) as { messages: unknown[] }).messages.length
  }
  const listener = await pool.connect()
  t.teardown(() => listener.release())
  listener.on('error', () => {})
  const heard: string[] = []
  listener.on('notification', (n) => heard.push(n.channel))
  await listener.query('LISTEN hookq_outbox')

  await pool.query(`SELECT hookq_produce('told', '"unannounced"')`)
  await waitUntil(async () => (await count()) === 1, 20_000, 'a commit that sent no NOTIFY to be moved by the looking broker')
  t.same(heard, [], 'no NOTIFY while no process could wait')

  await holder.query('SELECT pg_advisory_unlock_shared($1)', [0x686b7157])
  const waiting = async () =>
    (
      await pool.query(
        `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid::bigint = $1 AND mode = 'ExclusiveLock' AND granted
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        [0x686b7157],
      )
    ).rowCount === 1
  await waitUntil(waiting, 20_000, 'the broker to take the wait lock')
  await pool.query(`SELECT hookq_produce('told', '"announced"')`)
  await waitUntil(async () => (await count()) === 2, 20_000, 'a commit to be moved on its NOTIFY (the poll is a minute)')
  await waitUntil(() => heard.length > 0, 5000, 'the NOTIFY to reach the test as well')
  t.same(heard, ['hookq_outbox'], 'the commit NOTIFYd the waiting broker')
})

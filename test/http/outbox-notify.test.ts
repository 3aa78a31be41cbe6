/**
 * The broker is woken by PostgreSQL when a hookq_produce() transaction commits (a trigger NOTIFYs,
 * the member session LISTENs), not by polling: with the backstop poll at a minute, a committed
 * message is still moved at once, and again after the member session was cut and joined anew.
 */
import t from 'tap'
import pg from 'pg'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('hookq_produce commits wake the broker; the backstop poll is not what moves them', { skip: needsServer }, async (t) => {
  const { broker, url } = await startListeningBroker(t, { HOOKQ_OUTBOX_POLL_MS: '60000', HOOKQ_CLUSTER_POLL_MS: '100' })
  const pool = new pg.Pool({ connectionString: broker.databaseUrl, max: 2 })
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

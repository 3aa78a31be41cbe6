/**
 * A crash after the consumer answered a push and before its completion is durable (issue 30): the
 * next process pushes the message again with the next attempt number, so it is never lost, and it
 * counts that answered attempt once against maxDeliveries, not twice. The completion is held back
 * by a second session holding the partition's group_offsets row, which the completion's statement
 * must lock: the broker is killed while that statement waits.
 */
import pg from 'pg'
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

interface Push {
  offset: number
  attempt: number
}

t.test(
  'killed with a 2xx answered and its completion not written: pushed again as the next attempt, once',
  { skip: needsServer },
  async (t) => {
    const db = await testDatabase(t)
    const blocker = new pg.Client({ connectionString: db.url })
    await blocker.connect()
    t.teardown(() => blocker.end())
    const spawn = brokerSpawner(t, { DATABASE_URL: db.url })
    let broker = await spawn()

    // The first push is answered 200 only once the offsets row is held: its completion then waits.
    let holding: Promise<unknown> | undefined
    const receiver = await startReceiver(t, (req) => {
      if (req.json && (req.json as Push).attempt === 1 && !holding) {
        holding = blocker
          .query('BEGIN')
          .then(() =>
            blocker.query("SELECT 1 FROM group_offsets o JOIN consumer_groups g ON g.id = o.group_id WHERE g.name = 'ac-g' FOR UPDATE"),
          )
        return { status: 200, after: holding }
      }
      return { status: 200 }
    })
    t.equal((await call(broker.url, 'PUT', '/v1/topics/ac', { partitions: 1 })).status, 201)
    t.equal((await call(broker.url, 'PUT', '/v1/topics/ac-dlq', { partitions: 1 })).status, 201)
    const group = { topic: 'ac', ackMode: 'auto', maxDeliveries: 2, deadLetterTopic: 'ac-dlq' }
    t.equal((await call(broker.url, 'PUT', '/v1/groups/ac-g', group)).status, 201)
    t.equal((await call(broker.url, 'POST', '/v1/groups/ac-g/consumers', { url: receiver.url })).status, 201)
    t.equal((await call(broker.url, 'POST', '/v1/topics/ac/messages', { messages: [{ value: 'only' }] })).status, 201)

    await receiver.waitFor(1, 60_000)
    // The completion's statement waits for the row: the broker has the answer, and nothing durable says so.
    const waiting = await waitUntil(
      async () => {
        const { rows } = await blocker.query(
          "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
        )
        return rows.length > 0 ? rows.map((r: { pid: number }) => r.pid) : undefined
      },
      60_000,
      "the completion's statement waiting for the offsets row",
    )
    broker.child.kill('SIGKILL')
    await broker.exited
    // A statement sent before the crash would still commit once the row is free: its session goes
    // first, as it would with the broker's host (the connection cut with the process).
    for (const pid of waiting) await blocker.query('SELECT pg_terminate_backend($1)', [pid])
    await blocker.query('ROLLBACK')
    const offsets = await blocker.query(
      "SELECT committed_offset::int AS c, pushed_offset::int AS p FROM group_offsets o JOIN consumer_groups g ON g.id = o.group_id WHERE g.name = 'ac-g'",
    )
    t.same(offsets.rows, [{ c: 0, p: 1 }], 'not completed, reserved: the answered attempt is all that is on record')

    broker = await spawn()
    const received = await receiver.waitFor(2, 60_000)
    const pushes = received.map((r) => r.json as Push)
    await waitUntil(
      async () => {
        const g = await call(broker.url, 'GET', '/v1/groups/ac-g')
        return g.json.partitions[0].committedOffset === 1
      },
      60_000,
      'the message completed by the second process',
    )
    t.same(
      pushes.map((p) => [p.offset, p.attempt]),
      [
        [0, 1],
        [0, 2],
      ],
      'pushed again as attempt 2: the answered attempt counted once',
    )
    t.equal(
      received[1]!.headers['webhook-id'],
      received[0]!.headers['webhook-id'],
      'the same message id: the consumer can tell it saw it before',
    )
    const dlq = await call(broker.url, 'GET', '/v1/topics/ac-dlq/partitions/0/messages')
    t.same(dlq.json.messages, [], 'not dead-lettered: attempt 2 was within maxDeliveries 2')
    t.equal(receiver.requests.length, 2, 'no third push')
  },
)

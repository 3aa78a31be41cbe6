/**
 * The dispatcher alone, on a clock the test steps: no broker, no HTTP routes, no sleeps for
 * deadlines. Real PostgreSQL (its stores, a database of its own) and a real receiver on 127.0.0.1;
 * only time is the test's. Deadlines, backoffs, delays, late acks, nacks, extends and seeks are
 * raced by moving the clock to exactly the moment that matters.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { createPushAgent } from '../../src/dispatch/pusher.ts'
import { seekOffsets } from '../../src/store/consumption.ts'
import { needsServer } from '../helpers/db.ts'
import { dispatcherFile } from '../helpers/dispatcher.ts'
import type { Envelope } from '../helpers/push-group.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'
import type { PushLease } from '../../src/dispatch/push-send.ts'

const { db, groups, setup } = await dispatcherFile(t)

t.test('a passed ack deadline: timed out, pushed again after the backoff, and a late ack of attempt 1 still completes', async (t) => {
  const s = await setup(t, 'deadline', {
    ackTimeoutMs: 5000,
    retry: { initialDelayMs: 2000, multiplier: 2, maxDelayMs: 60_000, jitter: 0 },
  })
  await s.produce(['a'])
  const first = await s.pushed(1)
  t.match(first, { offset: 0, attempt: 1 })
  s.clock.advance(4999)
  t.equal(s.dispatcher.inFlight(s.groupId, 0), 1)
  t.equal(s.pushes().length, 1, 'nothing happens before the deadline')
  s.clock.advance(1) // the deadline: timed out, retry due in 2000 ms
  s.clock.advance(1999)
  t.equal(s.pushes().length, 1, 'not pushed again during the backoff')
  s.clock.advance(1)
  const second = await s.pushed(2)
  t.match(second, { offset: 0, attempt: 2 })
  t.not(second.deliveryId, first.deliveryId)
  // The late ack of attempt 1 completes the message and settles attempt 2 too.
  t.same(
    (await s.dispatcher.ack('deadline', [first.deliveryId])).map((r) => r.status),
    ['acked'],
  )
  t.equal(await s.committed(), 1)
  t.same(
    (await s.dispatcher.ack('deadline', [second.deliveryId])).map((r) => r.status),
    ['already_completed'],
  )
  await s.attempts.flush(true)
  const rows = (await db.pool.query('SELECT attempt, outcome FROM deliveries WHERE group_id = $1 ORDER BY attempt', [s.groupId])).rows
  // Attempt 1 is recorded acked (its id was acked, late); attempt 2, still open, ends with the message.
  t.same(
    rows,
    [
      { attempt: 1, outcome: 'acked' },
      { attempt: 2, outcome: 'acked' },
    ],
    'one row per attempt',
  )
  s.clock.advance(60_000)
  t.equal(s.pushes().length, 2, 'nothing after the completion')
})

t.test(
  'an acked message gives up its maxInFlight slot while its completion is written; the partition holds at most twice maxInFlight',
  // A second session holds a row lock: the embedded database has one connection.
  { skip: needsServer },
  async (t) => {
    const s = await setup(t, 'slot', { ackTimeoutMs: 60_000, maxInFlight: 1 })
    await s.produce(['a', 'b', 'c'])
    const first = await s.pushed(1)
    await s.answered()
    // The partition's offsets row locked by another session: the ack's completion cannot be written.
    const blocker = await db.pool.connect()
    t.teardown(() => blocker.release())
    await blocker.query('BEGIN')
    await blocker.query('SELECT 1 FROM group_offsets WHERE group_id = $1 FOR UPDATE', [s.groupId])
    const ack = s.dispatcher.ack('slot', [first.deliveryId])
    // Offset 0 is being completed and no longer holds the slot: offset 1 is admitted (its
    // reservation waits for the same writer), offset 2 is not (offset 1 holds the slot).
    await waitUntil(() => s.dispatcher.inFlight(s.groupId, 0) === 2, 10_000, 'offset 1 admitted beside the completion of offset 0')
    t.equal(s.pushes().length, 1, 'offset 1 is not pushed before its reservation is written')
    await blocker.query('COMMIT')
    t.same(
      (await ack).map((r) => r.status),
      ['acked'],
    )
    t.match(await s.pushed(2), { offset: 1, attempt: 1 })
    t.equal(s.dispatcher.inFlight(s.groupId, 0), 1, 'offset 2 waits for the slot offset 1 holds')
    t.same(
      (await s.dispatcher.ack('slot', [s.pushes()[1]!.deliveryId])).map((r) => r.status),
      ['acked'],
    )
    t.match(await s.pushed(3), { offset: 2, attempt: 1 })
    await waitUntil(async () => (await s.committed()) === 2, 10_000, 'offsets 0 and 1 committed')
  },
)

t.test(
  'a retry lease whose caller was answered before it was written is leasable again at once, not stranded until its deadline',
  // A second session holds a row lock: the embedded database has one connection.
  { skip: needsServer },
  async (t) => {
    const s = await setup(t, 'stranded', { delivery: 'pull', ackTimeoutMs: 60_000 })
    await s.produce(['a'])
    const [leased] = await s.dispatcher.pull('stranded', { maxMessages: 1, waitMs: 0, leaseMs: undefined })
    const first = JSON.parse(leased!)
    t.same(
      (await s.dispatcher.nack('stranded', [first.deliveryId], 0, false)).map((r) => r.status),
      ['nacked'],
    )
    // The partition's offsets row locked by another session: the retry's fence (a statement written
    // before a retry goes out) cannot be written.
    const blocker = await db.pool.connect()
    // Never back to the pool holding the lock (a failed assert before the COMMIT).
    t.teardown(() => blocker.query('ROLLBACK').finally(() => blocker.release(true)))
    await blocker.query('BEGIN')
    await blocker.query('SELECT 1 FROM group_offsets WHERE group_id = $1 FOR UPDATE', [s.groupId])
    s.clock.advance(1) // the nack's retry falls due (no delay)
    const retry = s.dispatcher.pull('stranded', { maxMessages: 1, waitMs: 0, leaseMs: undefined })
    await waitUntil(
      async () =>
        Number(
          (
            await db.pool.query(
              `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%group_offsets%'`,
            )
          ).rows[0].count,
        ) > 0,
      10_000,
      'the fence waiting for the row lock',
    )
    // A pull without waitMs answers at its limit (2 s) whatever it waits for: here, the fence.
    s.clock.advance(2_000)
    t.same(await retry, [], 'answered empty at its limit')
    await blocker.query('COMMIT')
    // The retry lease goes out now, to a caller already answered. A long poll gets the message,
    // well before that lease's 60 s deadline.
    let answer: string[] | undefined
    void s.dispatcher.pull('stranded', { maxMessages: 1, waitMs: 30_000, leaseMs: undefined }).then((a) => {
      answer = a
    })
    // Real time for the database, the stepped clock for the broker's timers: a few ms of it per look.
    await waitUntil(
      () => {
        s.clock.advance(5)
        return answer
      },
      10_000,
      'the long poll answered',
    )
    t.equal(answer!.length, 1, 'the message, leased again')
    t.match(JSON.parse(answer![0]!), { offset: 0, value: 'a', attempt: 3 })
    // Attempt 2 reached no one: a failed attempt on record, saying why.
    await s.attempts.flush(true)
    const two = await db.pool.query(`SELECT outcome::text AS outcome, error FROM deliveries WHERE group_id = $1 AND attempt = 2`, [
      s.groupId,
    ])
    t.match(two.rows, [{ outcome: 'failed', error: /answered before the lease was handed to it/ }])
  },
)

t.test('a window of one: six first pushes go one at a time, each once and in order, and the reservation ends where they did', async (t) => {
  // A window of one: each first push waits for the one before to be answered, and for a
  // reservation of its own (the window's room is promised to the reservation under way).
  const s = await setup(t, 'narrow', { ackTimeoutMs: 60_000, maxInFlight: 10 }, { pushWindow: { initial: 1, max: 1 } })
  await s.produce([0, 1, 2, 3, 4, 5])
  await s.pushed(6)
  t.same(
    s.pushes().map((p) => [p.offset, p.attempt]),
    [0, 1, 2, 3, 4, 5].map((o) => [o, 1]),
    'each pushed once, in order',
  )
  const reserved = async () =>
    Number((await db.pool.query('SELECT pushed_offset FROM group_offsets WHERE group_id = $1', [s.groupId])).rows[0].pushed_offset)
  t.equal(await reserved(), 6, 'reserved as far as what went out')
})

t.test("a consumer's window is shared by its partitions: no reservation for a first push the window cannot take", async (t) => {
  // One consumer for two partitions, a window of one, every push left unanswered. Paused while a
  // message is produced to each (handed over with the append, so each partition holds its own
  // without a read), then resumed: both are admitted in one pass, the first reserved
  // takes the window, and the other must not be reserved (a crash would count an attempt for it,
  // dead-lettered at maxDeliveries 1 without a push).
  const group = { ackMode: 'auto', pushTimeoutMs: 60_000, ackTimeoutMs: 60_000 } as const
  const s = await setup(
    t,
    'shared',
    { ...group, paused: true },
    { pushWindow: { initial: 1, max: 1 }, partitions: 2, behaviour: () => ({ hang: true }) },
  )
  await s.own(1)
  await s.produce(['a'], 0, 0, true)
  await s.produce(['b'], 0, 1, true)
  await groups.put('shared', { topic: 'shared', ...group, paused: false })
  await s.dispatcher.reload('shared')
  const first = await s.pushed(1)
  const reserved = (
    await db.pool.query('SELECT partition, pushed_offset FROM group_offsets WHERE group_id = $1 ORDER BY partition', [s.groupId])
  ).rows
  t.same(
    reserved.map((r) => Number(r.pushed_offset)),
    [0, 1].map((p) => (p === first.partition ? 1 : 0)),
    'only the pushed partition is reserved',
  )
  t.equal(s.pushes().length, 1, 'the window holds the other')
})

t.test("a partition left waiting for the room another partition's reservation held goes on when that reservation ends", async (t) => {
  // As above, with every push answered: the message left ready is not among the partitions that
  // wait for a push to end (the window had room when it was left), so the reservation's end must
  // fill it; nothing else happens here that would.
  const group = { ackMode: 'auto', pushTimeoutMs: 60_000, ackTimeoutMs: 60_000 } as const
  const s = await setup(t, 'sibling', { ...group, paused: true }, { pushWindow: { initial: 1, max: 1 }, partitions: 2 })
  await s.own(1)
  await s.produce(['a'], 0, 0, true)
  await s.produce(['b'], 0, 1, true)
  await groups.put('sibling', { topic: 'sibling', ...group, paused: false })
  await s.dispatcher.reload('sibling')
  await s.pushed(2)
  t.same(
    s
      .pushes()
      .map((p) => p.partition)
      .sort(),
    [0, 1],
    'both partitions pushed',
  )
})

t.test('extend moves the deadline; nack with delayMs waits exactly that long', async (t) => {
  const s = await setup(t, 'extend', { ackTimeoutMs: 5000, retry: { initialDelayMs: 100, multiplier: 2, maxDelayMs: 100, jitter: 0 } })
  await s.produce(['a'])
  const first = await s.pushed(1)
  // A nack that comes while its push is out settles with the push's answer, and its delay counts
  // from then: on this clock, only from the answer on.
  await s.answered()
  s.clock.advance(4000)
  t.same(
    (await s.dispatcher.extend('extend', [first.deliveryId], 10_000)).map((r) => r.status),
    ['extended'],
  )
  s.clock.advance(9999) // past the old deadline, one ms before the new one
  t.equal(s.pushes().length, 1)
  t.same(
    (await s.dispatcher.nack('extend', [first.deliveryId], 3000, false)).map((r) => r.status),
    ['nacked'],
  )
  s.clock.advance(2999)
  t.equal(s.pushes().length, 1, 'the nack delay, not the 100 ms backoff')
  s.clock.advance(1)
  t.match(await s.pushed(2), { attempt: 2 })
  t.same(
    (await s.dispatcher.extend('extend', [first.deliveryId], 1000)).map((r) => r.status),
    ['already_completed'],
    'the nacked attempt cannot be extended',
  )
})

t.test('maxDeliveries: after the last deadline the message is dead, and the next one flows', async (t) => {
  const s = await setup(t, 'dead', {
    ackTimeoutMs: 1000,
    maxDeliveries: 2,
    maxInFlight: 1,
    ordered: true,
    retry: { initialDelayMs: 500, multiplier: 1, maxDelayMs: 500, jitter: 0 },
  })
  await s.produce(['a', 'b'])
  t.match(await s.pushed(1), { offset: 0, attempt: 1 })
  s.clock.advance(1000 + 500)
  t.match(await s.pushed(2), { offset: 0, attempt: 2 })
  t.equal(s.pushes().length, 2, 'ordered: offset 1 waits')
  s.clock.advance(1000)
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'offset 0 dead-lettered (recorded as dead)')
  t.match(await s.pushed(3), { offset: 1, attempt: 1 })
})

t.test('a delayed message is pushed when its delay ends on the clock, not before', async (t) => {
  const s = await setup(t, 'delay', {})
  // The stored produce time is the database's; the delay counts from it.
  await s.produce(['later'], 60_000)
  const producedAt = Number(
    (await db.pool.query(`SELECT (extract(epoch from produced_at) * 1000)::float8 AS ms FROM messages`)).rows.at(-1).ms,
  )
  s.clock.advance(producedAt + 60_000 - s.clock.nowMs - 1)
  t.equal(s.pushes().length, 0)
  s.clock.advance(1)
  t.match(await s.pushed(1), { offset: 0, attempt: 1 })
})

t.test('a seek while a push is out: its id no longer counts, and the partition starts again', async (t) => {
  const s = await setup(t, 'seek', { ackTimeoutMs: 30_000 })
  await s.produce(['a', 'b'])
  const [a] = [await s.pushed(1), await s.pushed(2)]
  s.clock.advance(10)
  // What src/cluster/cluster.ts seek does: offsets written with a new epoch, then the owner claims the partition again.
  await seekOffsets(db, s.groupId, s.topic.id, new Map([[0, 0]]), s.clock.nowMs)
  await s.dispatcher.release('seek', 0, false)
  await s.own()
  t.same(
    (await s.dispatcher.ack('seek', [a!.deliveryId])).map((r) => r.status),
    ['unknown'],
    'an id from before the seek',
  )
  // Both offsets again, pushed in parallel (they may arrive in either order).
  await s.pushed(4)
  const again = s
    .pushes()
    .slice(2)
    .find((p) => p.offset === 0)!
  t.match(again, { offset: 0, attempt: 1 }, 'replayed from the seek, attempt numbers start again')
  t.same(
    (await s.dispatcher.ack('seek', [again.deliveryId])).map((r) => r.status),
    ['acked'],
  )
  t.same(s.errors, [], 'no step failed')
})

t.test('auto mode: a push in flight has no ack deadline of its own until extended; then the deadline holds', async (t) => {
  // pushTimeoutMs never exceeds ackTimeoutMs, so in auto mode the answer (or the push's own timeout,
  // in real time here: 20 s, longer than the test) settles an attempt before its ack deadline could.
  const s = await setup(t, 'autoext', {
    ackMode: 'auto',
    ackTimeoutMs: 30_000,
    pushTimeoutMs: 20_000,
    retry: { initialDelayMs: 100, multiplier: 1, maxDelayMs: 100, jitter: 0 },
  })
  s.receiver.setBehaviour({ hang: true })
  await s.produce(['a'])
  const first = await s.pushed(1)
  s.clock.advance(60_000)
  t.equal(s.pushes().length, 1, 'no deadline passed: the first push is still waiting for its answer')
  t.same(
    (await s.dispatcher.extend('autoext', [first.deliveryId], 2000)).map((r) => r.status),
    ['extended'],
  )
  s.receiver.setBehaviour({ status: 200 })
  s.clock.advance(1999)
  t.equal(s.pushes().length, 1)
  s.clock.advance(1) // the extended deadline passes: timed out, pushed again after the 100 ms backoff
  s.clock.advance(100)
  t.match(await s.pushed(2), { offset: 0, attempt: 2 })
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'the second push, answered 200, completes it')
  t.same(s.errors, [], 'no step failed')
})

t.test('auto mode: an ack of a delivery id whose message the answer completed is already_completed; a forged one unknown', async (t) => {
  const s = await setup(t, 'autoack', { ackMode: 'auto' })
  await s.produce(['a'])
  const first = await s.pushed(1)
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'completed by the 2xx')
  t.same(
    (await s.dispatcher.ack('autoack', [first.deliveryId])).map((r) => r.status),
    ['already_completed'],
    'answered from the attempt log',
  )
  await s.attempts.flush(true)
  t.same(
    (await s.dispatcher.ack('autoack', [first.deliveryId])).map((r) => r.status),
    ['already_completed'],
    'and from the table once written',
  )
  // The same coordinates with other random bits: never issued.
  const raw = Buffer.from(first.deliveryId, 'base64url')
  raw[35] = raw[35]! ^ 0xff
  t.same(
    (await s.dispatcher.ack('autoack', [raw.toString('base64url')])).map((r) => r.status),
    ['unknown'],
  )
})

t.test(
  'explicit mode: an id of the message in flight with other random bits is unknown and changes nothing; its own id acks it',
  async (t) => {
    const s = await setup(t, 'forged', { ackTimeoutMs: 30_000 })
    await s.produce(['a'])
    const first = await s.pushed(1)
    // The coordinates of the outstanding message, but not an id it was issued.
    const raw = Buffer.from(first.deliveryId, 'base64url')
    raw[30] = raw[30]! ^ 0x01
    const forged = raw.toString('base64url')
    t.same(
      (await s.dispatcher.ack('forged', [forged])).map((r) => r.status),
      ['unknown'],
    )
    t.same(
      (await s.dispatcher.nack('forged', [forged], 0, false)).map((r) => r.status),
      ['unknown'],
    )
    t.same(
      (await s.dispatcher.extend('forged', [forged], 60_000)).map((r) => r.status),
      ['unknown'],
    )
    t.equal(s.dispatcher.inFlight(s.groupId, 0), 1, 'still in flight')
    t.equal(await s.committed(), 0, 'not completed')
    t.same(
      (await s.dispatcher.ack('forged', [first.deliveryId])).map((r) => r.status),
      ['acked'],
    )
    t.equal(await s.committed(), 1)
    t.same(s.errors, [], 'no step failed')
  },
)

t.test('410 Gone: a reload between the push and its answer does not leave the consumer enabled', async (t) => {
  // The 410 is held until the test lets it go; meanwhile a reload replaces the group's consumer
  // rows, so the row the push was made with is not the group's any more when the answer comes.
  let letAnswer!: () => void
  const answer = new Promise<void>((resolve) => {
    letAnswer = resolve
  })
  const s = await setup(t, 'gone-reload', { ackMode: 'auto', retry: { initialDelayMs: 200, maxDelayMs: 200, jitter: 0 } })
  s.receiver.setBehaviour({ status: 410, after: answer })
  const other = await startReceiver(t)
  await groups.addConsumer('gone-reload', { url: other.url })
  await s.dispatcher.reload('gone-reload')
  await s.produce(['a'])
  t.match(await s.pushed(1), { offset: 0, attempt: 1 }, 'the first consumer (it holds the partition) is pushed to')
  await s.dispatcher.reload('gone-reload') // new consumer rows while the push is out
  letAnswer()
  await s.answered()
  s.clock.advance(200) // the retry is due
  await waitUntil(() => s.receiver.requests.length + other.requests.length >= 2, 10_000, 'the retry pushed')
  t.equal(s.receiver.requests.length, 1, 'the consumer that answered 410 got no second push')
  t.match(other.requests[0]!.json, { offset: 0, attempt: 2 }, 'the retry went to the other consumer')
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'completed there')
  t.same(s.errors, [], 'no step failed')
})

t.test('410 Gone: a reload that read the consumers before the disable was written does not enable it again', async (t) => {
  // The disable's write waits until the test lets it go: the reload below reads the consumer as enabled.
  let letWrite!: () => void
  const written = new Promise<void>((resolve) => {
    letWrite = resolve
  })
  const disables: string[] = []
  const s = await setup(
    t,
    'gone-race',
    { ackMode: 'auto', retry: { initialDelayMs: 200, maxDelayMs: 200, jitter: 0 } },
    {
      disableConsumer: async (id, reason) => {
        disables.push(id)
        await written
        await groups.disableConsumer(id, reason)
      },
    },
  )
  s.receiver.setBehaviour({ status: 410 })
  const other = await startReceiver(t)
  await groups.addConsumer('gone-race', { url: other.url })
  await s.dispatcher.reload('gone-race')
  await s.produce(['a'])
  t.match(await s.pushed(1), { offset: 0, attempt: 1 }, 'the first consumer (it holds the partition) answers 410')
  await s.answered()
  t.equal(disables.length, 1, 'its disable is being written')
  await s.dispatcher.reload('gone-race') // reads it as enabled: the write has not committed
  s.clock.advance(200) // the retry is due
  letWrite()
  await waitUntil(() => s.receiver.requests.length + other.requests.length >= 2, 10_000, 'the retry pushed')
  t.equal(s.receiver.requests.length, 1, 'the disabled consumer got no second push')
  t.match(other.requests[0]!.json, { offset: 0, attempt: 2 }, 'the retry went to the other consumer')
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'completed there')

  const first = (await groups.load('gone-race'))!.consumers[0]!
  t.match(first, { url: s.receiver.url, disabledReason: /410/ }, 'and disabled in the database once written')
  t.not(first.disabledAt, null)
  t.same(s.errors, [], 'no step failed')
})

t.test('no push goes out while the lease has lapsed: it waits, then goes, or goes nowhere once its partition is dropped', async (t) => {
  let held = true
  let waiting: (() => void)[] = []
  const lease: PushLease = { held: () => held, wait: (fn) => void waiting.push(fn) }
  const wake = () => {
    const w = waiting
    waiting = []
    for (const fn of w) fn()
  }
  const s = await setup(t, 'lease', { ackMode: 'auto' }, { lease })
  held = false
  await s.produce(['a', 'b'])
  // (One wait for the partition, not one per message: PushFlow.start checks the lease before an attempt begins.)
  await waitUntil(() => waiting.length >= 1, 10_000, 'the pushes wait for the lease')
  await absenceWindow(300)
  t.equal(s.pushes().length, 0, 'nothing pushed while the lease has lapsed')
  held = true
  wake()
  await s.pushed(2)
  t.same(
    s.pushes().map((p) => `${p.offset}:${p.attempt}`),
    ['0:1', '1:1'],
    'both pushed once it is proven again, as attempt 1',
  )
  await s.answered()
  held = false
  await s.produce(['c'])
  await waitUntil(() => waiting.length >= 1, 10_000, 'the next push waits')
  s.dispatcher.releaseAll() // the session was lost
  wake()
  await absenceWindow(300)
  t.equal(s.pushes().length, 2, 'the waiting push went nowhere once its partition was dropped')
  t.ok(
    s.dispatcher.pushWindows().every((w) => w.inFlight === 0),
    "its slot in the consumer's window went back",
  )
})

/**
 * One connection to the consumer, offset 0's push held on it until `answerFirst`, and offset 1's
 * attempt begun and queued in the client for that connection; then the lease lapses (`lapse`) and
 * offset 0 is answered: offset 1's push waits for the lease when it gets the connection. `prove`
 * holds the lease again and wakes what waits for it.
 */
async function queuedBehindLapsedLease(t: Test, name: string) {
  let held = true
  let waiting: (() => void)[] = []
  const lease: PushLease = { held: () => held, wait: (fn) => void waiting.push(fn) }
  const oneConnection = createPushAgent({ connections: 1 })
  t.teardown(() => oneConnection.destroy())
  let answerFirst: () => void = () => {}
  const first = new Promise<void>((r) => {
    answerFirst = r
  })
  const s = await setup(
    t,
    name,
    { ackMode: 'auto' },
    { lease, agent: oneConnection, behaviour: (req) => ((req.json as Envelope).offset === 0 ? { after: first } : {}) },
  )
  await s.produce(['a', 'b'])
  await s.pushed(1) // offset 0 holds the one connection; offset 1 waits for it in the client
  // Offset 1's attempt has begun (the window counts it from its start): it is the client's gate that
  // must stop it, not the push flow's own lease check before an attempt begins.
  await waitUntil(() => s.dispatcher.pushWindows().some((w) => w.inFlight === 2), 10_000, 'offset 1 under way')
  held = false // the lease lapses while offset 1 queues
  answerFirst()
  await waitUntil(() => waiting.length >= 1, 10_000, 'the queued push waits for the lease')
  const prove = () => {
    held = true
    const w = waiting
    waiting = []
    for (const fn of w) fn()
  }
  return { s, prove }
}

t.test("a push queued behind its consumer's other requests asks for the lease again when it gets a connection", async (t) => {
  const { s, prove } = await queuedBehindLapsedLease(t, 'queued')
  await absenceWindow(300)
  t.equal(s.pushes().length, 1, 'the queued push did not go out once its connection was free')
  prove()
  t.match(await s.pushed(2), { offset: 1, attempt: 1 }, 'it goes once the lease is proven, as the same attempt')
})

t.test(
  'a queued push that never went out is no attempt: the session lost, its number and reservation go back for the next owner',
  async (t) => {
    const { s, prove } = await queuedBehindLapsedLease(t, 'unsent')
    await waitUntil(async () => (await s.committed()) === 1, 10_000, 'offset 0 completed by its answer')
    // Its row is written first (held holdMs for an outcome, then filed in flight), so that the
    // handover must delete it, not merely forget a row never filed.
    const rowsNow = async () =>
      (await db.pool.query('SELECT "offset", attempt FROM deliveries WHERE group_id = $1 ORDER BY "offset"', [s.groupId])).rows.map(
        (r) => `${r.offset}:${r.attempt}`,
      )
    s.clock.advance(1001)
    await s.attempts.flush(true)
    t.same(await rowsNow(), ['0:1', '1:1'], 'the queued attempt had begun: its row was filed')
    s.dispatcher.releaseAll() // the session was lost before the lease was proven again
    prove() // what waited for the lease finds its partition dropped
    const reservation = async () =>
      Number((await db.pool.query('SELECT pushed_offset FROM group_offsets WHERE group_id = $1', [s.groupId])).rows[0].pushed_offset)
    await waitUntil(async () => (await reservation()) === 1, 10_000, 'the reservation of offset 1 given back')
    await s.attempts.flush(true)
    t.same(await rowsNow(), ['0:1'], 'no row for the attempt that never went out')
    t.equal(s.pushes().length, 1, 'it never went out')
    await s.own() // this process (standing in for the next owner) claims the partition again
    t.match(await s.pushed(2), { offset: 1, attempt: 1 }, 'the next owner pushes it as attempt 1')
  },
)

t.test(
  'pushes handed over in flight are the next owner’s attempts in flight: extended, nacked, timed out there, their rows in flight meanwhile',
  async (t) => {
    // A CI run of test/process/ack-stale-view.test.ts: the next owner held such messages for their
    // deadlines but answered `already_completed` to their extends and nacks (and its load had marked
    // their rows failed), so the consumer's extend was lost and its nack waited out the deadline.
    const s = await setup(t, 'handed', { ackTimeoutMs: 10_000, retry: { initialDelayMs: 500, multiplier: 1, maxDelayMs: 500, jitter: 0 } })
    await s.produce(['a', 'b', 'c'])
    await s.pushed(3)
    await s.answered()
    const first = new Map(s.pushes().map((p) => [p.offset, p]))
    // Handed over (a graceful release, as for a partition beyond this process's share), then claimed
    // with a new epoch: what the next owner loads from PostgreSQL.
    await s.dispatcher.release('handed', 0, true)
    await s.own()
    await waitUntil(() => s.dispatcher.inFlight(s.groupId, 0) === 3, 10_000, 'all three held by the next owner')
    const outcomes = async () =>
      (await db.pool.query(`SELECT "offset"::int AS o, attempt, outcome FROM deliveries WHERE group_id = $1 ORDER BY 1, 2`, [s.groupId]))
        .rows
    t.same(
      (await outcomes()).map((r) => r.outcome),
      ['in_flight', 'in_flight', 'in_flight'],
      'their rows stay in flight: the consumer may still ack them',
    )
    t.same(
      (await s.dispatcher.extend('handed', [first.get(0)!.deliveryId], 30_000)).map((r) => r.status),
      ['extended'],
      'an extend of a push handed over moves its deadline at the next owner',
    )
    t.same(
      (await s.dispatcher.nack('handed', [first.get(1)!.deliveryId], 0, false)).map((r) => r.status),
      ['nacked'],
      'a nack of a push handed over is applied by the next owner',
    )
    s.clock.advance(0) // its retry, due now
    const again = await s.pushed(4)
    t.match(again, { offset: 1, attempt: 2 }, 'the nacked message goes again at once, as attempt 2')
    await s.answered()
    t.same(
      (await s.dispatcher.ack('handed', [again.deliveryId])).map((r) => r.status),
      ['acked'],
    )
    t.same(
      (await s.dispatcher.ack('handed', [first.get(2)!.deliveryId])).map((r) => r.status),
      ['acked'],
      'an ack of a push handed over completes its message',
    )
    s.clock.advance(10_000 + 500)
    t.equal(s.pushes().length, 4, 'the extended message is not pushed at its old deadline')
    s.clock.advance(20_000) // the extended deadline: timed out, then the 500 ms backoff
    t.equal(s.pushes().length, 4, 'not during the backoff')
    s.clock.advance(500)
    t.match(await s.pushed(5), { offset: 0, attempt: 2 }, 'the extended message goes again once its new deadline passed')
    await s.attempts.flush(true)
    t.same(
      await outcomes(),
      [
        { o: 0, attempt: 1, outcome: 'timed_out' },
        { o: 0, attempt: 2, outcome: 'in_flight' },
        { o: 1, attempt: 1, outcome: 'nacked' },
        { o: 1, attempt: 2, outcome: 'acked' },
        { o: 2, attempt: 1, outcome: 'acked' },
      ],
      'each handed-over attempt ends with the outcome the next owner gave it',
    )
    t.same(s.errors, [], 'no step failed')
  },
)

t.test("a filtered message's completion waits lazily, and is written once the wait ends", async (t) => {
  const s = await setup(t, 'lazy-filter', { ackMode: 'auto', filter: { key: 'keep' } }, { lazyCompletionMs: 60_000 })
  const { end, messages } = await s.append(['a', 'b'], { keys: ['drop', 'drop'] })
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  await waitUntil(() => s.clock.pending.length > 0, 10_000, 'the writer waiting for company')
  t.equal(await s.committed(), 0, 'not written while the wait lasts')
  s.clock.advance(60_000)
  await waitUntil(async () => (await s.committed()) === 2, 10_000, 'both filtered out, in one statement')
  t.equal(s.pushes().length, 0, 'nothing pushed')
  t.same(s.errors, [], 'no step failed')
})

t.test('lazy completions never hold a push back: past maxInFlight of them unwritten, the next one is written at once', async (t) => {
  // maxInFlight 1: a partition holds at most 2 messages out or being completed (Partition.hasRoom).
  // Each message is reserved by its own append, so no reservation job of the writer's would cut
  // a lazy wait short; the clock moves only by what each append catches up with (milliseconds), so
  // a completion waiting a minute's lazy wait is not written meanwhile.
  const s = await setup(t, 'lazy-cap', { ackMode: 'auto', maxInFlight: 1 }, { lazyCompletionMs: 60_000 })
  for (const [i, value] of ['a', 'b', 'c'].entries()) {
    const { end, messages } = await s.append([value], { reserve: true })
    s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
    await s.pushed(i + 1)
    await s.answered()
  }
  t.same(
    s.pushes().map((p) => [p.offset, p.attempt]),
    [
      [0, 1],
      [1, 1],
      [2, 1],
    ],
    'the third went without the lazy wait ending',
  )
  await waitUntil(
    async () => (await s.committed()) === 2,
    10_000,
    'the first two completed: the second was written at once, the first with it',
  )
  s.clock.advance(60_000)
  await waitUntil(async () => (await s.committed()) === 3, 10_000, 'the last one, lazily, once the clock moved')
  t.same(s.errors, [], 'no step failed')
})

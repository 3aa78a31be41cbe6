/**
 * An append reserves the first pushes of its messages in its own statement when the partition is
 * idle here (reservations.ts appendRoom, src/store/messages.ts): group_offsets.pushed_offset moves in
 * the produce's commit, so the push needs no second commit, and only as far as the rules of a
 * reservation allow (the room, delays, the fence). A real dispatcher on a stepped clock, a real
 * PostgreSQL and receiver: the tests read pushed_offset between the append and the hand-over.
 */
import t from '../helpers/tap.ts'
import { needsServer } from '../helpers/db.ts'
import { dispatcherFile } from '../helpers/dispatcher.ts'
import { waitUntil } from '../helpers/wait.ts'
import { attemptCounts, loadProgress } from '../../src/store/consumption.ts'

const { db, groups, setup } = await dispatcherFile(t)
/** Offsets 0 to 3 pushed once each, as attempt 1: [offset, attempt]. */
const FIRST_FOUR = [0, 1, 2, 3].map((offset) => [offset, 1])

t.test('an append to an idle partition reserves its first pushes in its own commit, and they go at once', async (t) => {
  const s = await setup(t, 'idle', { ackMode: 'auto' })
  const first = await s.append(['a'], { reserve: true })
  t.equal(await s.pushedOffset(), 1, 'the append moved the reservation past its message')
  s.dispatcher.notifyAppend(s.topic.id, 0, first.end, first.messages)
  t.match(await s.pushed(1), { offset: 0, attempt: 1 })
  await waitUntil(async () => (await s.committed()) === 1, 10_000, 'offset 0 completed')
  // Idle again once completed: the next append reserves too, several messages at once.
  const next = await s.append(['b', 'c', 'd'], { reserve: true })
  t.equal(await s.pushedOffset(), 4, 'the three messages reserved by their append')
  s.dispatcher.notifyAppend(s.topic.id, 0, next.end, next.messages)
  await s.pushed(4)
  t.same(
    s.pushes().map((p) => [p.offset, p.attempt]),
    FIRST_FOUR,
  )
  await waitUntil(async () => (await s.committed()) === 4, 10_000, 'all completed')
  t.equal(await s.pushedOffset(), 4, 'the reservation never ran ahead of the messages pushed')
  t.same(s.errors, [], 'no step failed')
})

t.test('no more than the room: a partition at maxInFlight reserves nothing, and an append reserves only what fits', async (t) => {
  const s = await setup(t, 'room', { ackTimeoutMs: 60_000, maxInFlight: 2 })
  const one = await s.append(['a'], { reserve: true })
  s.dispatcher.notifyAppend(s.topic.id, 0, one.end, one.messages)
  const a = await s.pushed(1)
  const more = await s.append(['b', 'c', 'd'], { reserve: true })
  t.equal(await s.pushedOffset(), 2, 'one slot of two was free: the append reserved one of its three')
  s.dispatcher.notifyAppend(s.topic.id, 0, more.end, more.messages)
  const b = await s.pushed(2)
  t.match(b, { offset: 1, attempt: 1 })
  t.equal(s.dispatcher.inFlight(s.groupId, 0), 2, 'offsets 2 and 3 wait for room, not admitted')
  t.equal(s.pushes().length, 2)
  const full = await s.append(['e'], { reserve: true })
  t.equal(await s.pushedOffset(), 2, 'nothing reserved by an append while messages wait for room')
  s.dispatcher.notifyAppend(s.topic.id, 0, full.end, full.messages)
  t.same(
    (await s.dispatcher.ack('room', [a.deliveryId, b.deliveryId])).map((r) => r.status),
    ['acked', 'acked'],
  )
  await s.pushed(4)
  t.same(
    s.pushes().map((p) => [p.offset, p.attempt]),
    FIRST_FOUR,
    'the rest go through the progress writer, attempt 1 each',
  )
  t.same(s.errors, [], 'no step failed')
})

t.test('a delayed message is not reserved by its append, nor anything after it', async (t) => {
  const s = await setup(t, 'delayed', { ackMode: 'auto' })
  const { end, messages } = await s.append(['later'], { delayMs: 5000, reserve: true })
  t.equal(await s.pushedOffset(), 0, 'a delayed message is reserved when its delay ends, not before')
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  s.clock.advance(5000)
  t.match(await s.pushed(1), { offset: 0, attempt: 1 })
  t.equal(await s.pushedOffset(), 1)
})

t.test('the reservation is fenced by the owner epoch: a partition claimed elsewhere meanwhile gets none', async (t) => {
  const s = await setup(t, 'fenced', { ackMode: 'auto' })
  // Another process claims the partition (a new epoch) without this one hearing of it yet.
  await db.pool.query('UPDATE group_offsets SET owner_epoch = owner_epoch + 1 WHERE group_id = $1', [s.groupId])
  const { end, messages } = await s.append(['a'], { reserve: true })
  t.equal(await s.pushedOffset(), 0, 'the append reserved nothing for an epoch no longer held')
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  // Its own reservation is refused too: the partition is dropped here, nothing pushed.
  await waitUntil(() => s.dispatcher.inFlight(s.groupId, 0) === 0 && s.errors.length === 0, 10_000, 'the partition dropped')
  t.equal(s.pushes().length, 0, 'nothing pushed by a process that lost the partition')
  t.equal(await s.pushedOffset(), 0)
})

t.test(
  'an append does not wait for an offsets row another write holds: its messages are reserved by the progress writer instead',
  // A second session holds the row: the embedded database has one connection.
  { skip: needsServer },
  async (t) => {
    const s = await setup(t, 'locked', { ackMode: 'auto' })
    const blocker = await db.pool.connect()
    t.teardown(() => blocker.release())
    await blocker.query('BEGIN')
    await blocker.query('SELECT 1 FROM group_offsets WHERE group_id = $1 FOR UPDATE', [s.groupId])
    let appended: Awaited<ReturnType<typeof s.append>> | undefined
    void s.append(['a'], { reserve: true }).then((a) => {
      appended = a
    })
    const { end, messages } = await waitUntil(() => appended, 10_000, 'the append, while the row is locked')
    await blocker.query('COMMIT')
    t.equal(await s.pushedOffset(), 0, 'the append reserved nothing')
    s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
    t.match(await s.pushed(1), { offset: 0, attempt: 1 })
    t.equal(await s.pushedOffset(), 1, 'reserved by the progress writer')
  },
)

t.test('a handover gives back what an append reserved but this process never took from the log', async (t) => {
  const s = await setup(t, 'handback', { ackMode: 'auto' })
  await s.append(['a', 'b'], { reserve: true })
  t.equal(await s.pushedOffset(), 2, 'reserved by the append')
  // Released before produce handed the messages over (or before they were read).
  await s.dispatcher.release('handback', 0, true)
  t.equal(await s.pushedOffset(), 0, 'the reservation moved back: the next owner pushes them as attempt 1')
  t.equal(s.pushes().length, 0)
})

for (const how of ['release', 'releaseAll'] as const) {
  t.test(
    `dropped at once (${how}, the session lost) while an append that claimed its first pushes is committing: given back after that commit`,
    // The append is held on its partition's row by a second session: the embedded database has one connection.
    { skip: needsServer },
    async (t) => {
      const s = await setup(t, `lost-${how}`, { ackMode: 'auto' })
      const blocker = await db.pool.connect()
      t.teardown(() => blocker.release())
      await blocker.query('BEGIN')
      await blocker.query('SELECT 1 FROM topic_partitions WHERE topic_id = $1 FOR UPDATE', [s.topic.id])
      // The order of the append's end and the give-back's statement (src/store/consumption.ts handBack).
      const order: string[] = []
      const query = db.pool.query.bind(db.pool)
      db.pool.query = ((...args: Parameters<typeof query>) => {
        const text = args[0] as unknown
        if (String((text as { text?: string }).text ?? text).includes('lowered AS')) order.push('given back')
        return query(...args)
      }) as typeof db.pool.query
      t.teardown(() => {
        db.pool.query = query
      })
      let claimed = 0
      const appending = s.append(['a'], {
        reserve: true,
        reserver: {
          reservationsFor: (entries) => {
            const claims = s.dispatcher.reservationsFor(entries)
            claimed += claims.length
            return claims
          },
          reservationsDone: (claims, reservedTo) => {
            order.push(`append reserved to ${reservedTo[0]}`)
            s.dispatcher.reservationsDone(claims, reservedTo)
          },
        },
      })
      await waitUntil(
        async () => claimed === 1 && (await query("SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'")).rowCount! > 0,
        10_000,
        'the append, its claim taken, waiting for the partition row',
      )
      const released = how === 'release' ? s.dispatcher.release(`lost-${how}`, 0, false) : s.dispatcher.releaseAll()
      await blocker.query('COMMIT')
      await appending
      await released
      await waitUntil(() => order.includes('given back'), 10_000, 'the give-back')
      t.same(order, ['append reserved to 1', 'given back'], 'the give-back waited for the append under way')
      // (releaseAll does not wait for the statement it starts.)
      await waitUntil(async () => (await s.pushedOffset()) === 0, 10_000, 'the reservation the append wrote after the drop, given back')
      t.equal(s.pushes().length, 0, 'nothing pushed here after the drop')
    },
  )
}

t.test('a partition left ready for the room an append held goes on once the append is done', async (t) => {
  // One consumer for two partitions, its push window one push: partition 1's message waits for
  // the room partition 0's append holds, and nothing but that append's end wakes it.
  const s = await setup(t, 'siblings', { ackMode: 'auto' }, { partitions: 2, pushWindow: { initial: 1, max: 1 } })
  await s.own(1)
  const claimed = { reserved: [] as (number | null)[] }
  let handOver: () => void = () => {}
  const a = s.append(['a'], {
    reserve: true,
    // The append's claim is taken, and partition 1's message arrives before its statement returns.
    reserver: {
      reservationsFor: (entries) => s.dispatcher.reservationsFor(entries),
      reservationsDone: (claims, reservedTo) => {
        claimed.reserved = [...reservedTo]
        handOver = () => s.dispatcher.reservationsDone(claims, reservedTo)
      },
    },
  })
  const { end, messages } = await a
  await s.produce(['b'], 0, 1, true)
  t.equal(s.pushes().length, 0, "partition 1's message waits: the window's room is partition 0's")
  handOver()
  t.same(claimed.reserved, [1], 'the append reserved its message')
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  await s.pushed(2)
  t.same(
    s
      .pushes()
      .map((p) => [p.partition, p.offset, p.attempt])
      .sort(),
    [
      [0, 0, 1],
      [1, 0, 1],
    ],
  )
  t.same(s.errors, [], 'no step failed')
})

t.test('key ordering: while one append holds a claim on the partition, another reserves nothing', async (t) => {
  // The first append's claim is held open (its hand-over deferred) while a second append of the
  // same key commits: reserved too, the second message would wait unpushed behind the first.
  const s = await setup(t, 'key-claims', { ackMode: 'auto', ordering: 'key' })
  const first = await appendHeld(s, ['a'], ['k'])
  t.equal(await s.pushedOffset(), 1, 'the first append reserved its message')
  const second = await s.append(['b'], { reserve: true, keys: ['k'] })
  t.equal(await s.pushedOffset(), 1, 'the second append, its key maybe the pending one, reserved nothing')
  first.handOver()
  s.dispatcher.notifyAppend(s.topic.id, 0, first.end, first.messages)
  s.dispatcher.notifyAppend(s.topic.id, 0, second.end, second.messages)
  await s.pushed(2)
  t.same(
    s.pushes().map((p) => [p.offset, p.attempt]),
    [
      [0, 1],
      [1, 1],
    ],
    'in key order, attempt 1 each',
  )
  t.same(s.errors, [], 'no step failed')
})

/**
 * Appends the values with their reservation's hand-over held back (as if produce were still
 * committing): the claim is taken and written, and `handOver` lets the dispatcher see it end.
 */
async function appendHeld(s: Awaited<ReturnType<typeof setup>>, values: unknown[], keys?: (string | null)[]) {
  let handOver: () => void = () => {}
  const appended = await s.append(values, {
    reserve: true,
    ...(keys ? { keys } : {}),
    reserver: {
      reservationsFor: (entries) => s.dispatcher.reservationsFor(entries),
      reservationsDone: (claims, reservedTo) => {
        handOver = () => s.dispatcher.reservationsDone(claims, reservedTo)
      },
    },
  })
  return { ...appended, handOver }
}

for (const how of ['paused', 'its consumer removed'] as const) {
  t.test(`a partition ${how} between an append's claim and its hand-over gives back what the append reserved`, async (t) => {
    // Left reserved, the messages would count as attempted after a crash: attempt 2 first, or
    // dead-lettered unpushed at maxDeliveries 1 (src/dispatch/stalled-reservations.ts).
    const name = how === 'paused' ? 'stall-paused' : 'stall-consumer'
    const group = { ackMode: 'auto' } as const
    const s = await setup(t, name, group)
    const { end, messages, handOver } = await appendHeld(s, ['a', 'b'])
    t.equal(await s.pushedOffset(), 2, 'the append reserved both')
    if (how === 'paused') await groups.put(name, { topic: name, ...group, paused: true })
    else await groups.removeConsumer(name, (await groups.consumers(name))[0]!.id)
    await s.dispatcher.reload(name)
    handOver()
    s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
    await waitUntil(async () => (await s.pushedOffset()) === 0, 10_000, 'the reservation given back')
    t.equal(s.pushes().length, 0, 'nothing pushed meanwhile')
    if (how === 'paused') await groups.put(name, { topic: name, ...group, paused: false })
    else await groups.addConsumer(name, { url: s.receiver.url })
    await s.dispatcher.reload(name)
    await s.pushed(2)
    t.same(
      s.pushes().map((p) => [p.offset, p.attempt]),
      [
        [0, 1],
        [1, 1],
      ],
      'once it can push again: attempt 1 each',
    )
    await waitUntil(async () => (await s.committed()) === 2, 10_000, 'both completed')
    t.equal(await s.pushedOffset(), 2, 'reserved again before they went')
    t.same(s.errors, [], 'no step failed')
  })
}

t.test('a paused partition gives back only what it never pushed, after the rows of what it did', async (t) => {
  // Offset 0 is out, unacked, its row not written yet (held for its outcome); offset 1 is
  // reserved by an append and never pushed. The give-back writes offset 0's row, then moves the
  // reservation back to 1: after a crash, the next owner counts offset 0's attempt by its row.
  const group = { ackMode: 'explicit', ackTimeoutMs: 60_000 } as const
  const s = await setup(t, 'stall-partly', group)
  await s.produce(['x'], 0, 0, true)
  await s.pushed(1)
  await s.answered()
  const { end, messages, handOver } = await appendHeld(s, ['a'])
  t.equal(await s.pushedOffset(), 2, 'the append reserved offset 1')
  await groups.put('stall-partly', { topic: 'stall-partly', ...group, paused: true })
  await s.dispatcher.reload('stall-partly')
  handOver()
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  await waitUntil(async () => (await s.pushedOffset()) === 1, 10_000, 'the reservation moved back to offset 1')
  const rows = await db.pool.query('SELECT "offset"::int AS offset, attempt, outcome::text FROM deliveries WHERE group_id = $1', [
    s.groupId,
  ])
  t.same(rows.rows, [{ offset: 0, attempt: 1, outcome: 'in_flight' }], "offset 0's attempt on record")
  t.equal(s.pushes().length, 1, 'offset 1 not pushed')
  t.same(s.errors, [], 'no step failed')
})

t.test('a give-back that failed is tried again a second later, with nothing else happening', async (t) => {
  const name = 'stall-retry'
  const group = { ackMode: 'auto' } as const
  const s = await setup(t, name, group)
  const query = db.pool.query.bind(db.pool)
  let failures = 1
  db.pool.query = ((...args: Parameters<typeof query>) => {
    const text = args[0] as unknown
    if (failures > 0 && String((text as { text?: string }).text ?? text).includes('lowered AS')) {
      failures--
      return Promise.reject(new Error('the connection broke'))
    }
    return query(...args)
  }) as typeof db.pool.query
  t.teardown(() => {
    db.pool.query = query
  })
  const { end, messages, handOver } = await appendHeld(s, ['a'])
  await groups.put(name, { topic: name, ...group, paused: true })
  await s.dispatcher.reload(name)
  handOver()
  s.dispatcher.notifyAppend(s.topic.id, 0, end, messages)
  await waitUntil(() => s.errors.length > 0, 10_000, 'the give-back failed')
  t.equal(await s.pushedOffset(), 1, 'still reserved')
  s.clock.advance(1000)
  await waitUntil(async () => (await s.pushedOffset()) === 0, 10_000, 'given back by the next try')
  t.equal(s.errors.length, 1, 'one failure logged')
})

/**
 * Offsets a crash now would count as attempted on the reservation alone (src/store/consumption.ts
 * attemptCounts: below pushed_offset, no attempt row, not completed) though nothing pushed them.
 */
async function countedNeverPushed(s: Awaited<ReturnType<typeof setup>>): Promise<number[]> {
  const [pushedTo, committed] = [await s.pushedOffset(), await s.committed()]
  const rows = await db.pool.query('SELECT DISTINCT "offset" FROM deliveries WHERE group_id = $1', [s.groupId])
  const withRow = new Set(rows.rows.map((r: { offset: string }) => Number(r.offset)))
  const pushedOffsets = new Set(s.pushes().map((p) => p.offset))
  const out: number[] = []
  for (let o = committed; o < pushedTo; o++) if (!withRow.has(o) && !pushedOffsets.has(o)) out.push(o)
  return out
}

t.test('a delayed message a reservation passed counts no attempt at a takeover while it is still delayed', async (t) => {
  const s = await setup(t, 'past-delayed', { ackMode: 'explicit', ackTimeoutMs: 60_000 })
  await s.produce(['later'], 600_000)
  await s.produce(['now'])
  t.match(await s.pushed(1), { offset: 1, attempt: 1 })
  t.same(await countedNeverPushed(s), [0], 'the reservation passed the delayed message: the case this test is about (docs/performance.md)')
  // What a process taking the partition over now would count.
  const progress = (await loadProgress(db.pool, s.groupId, s.topic.id, 0))!
  const counts = await attemptCounts(db.pool, s.groupId, s.topic.id, 0, progress)
  t.notOk(counts.has(0), 'the delayed message, never pushed, counts no attempt')
  t.equal(counts.get(1), 1, 'the pushed one counts its attempt')
  s.clock.advance(600_000)
  t.match(await s.pushed(2), { offset: 0, attempt: 1 })
  t.same(s.errors, [], 'no step failed')
})

t.test('a retry coming due takes no room a pending reservation was promised: the reserved message goes first', async (t) => {
  const s = await setup(t, 'promised', { ackMode: 'explicit', ackTimeoutMs: 60_000 }, { pushWindow: { initial: 1, max: 1 } })
  await s.produce(['m0'], 0, 0, true)
  const first = await s.pushed(1)
  await s.answered()
  t.same(
    (await s.dispatcher.nack('promised', [first.deliveryId], 1000, false)).map((r) => r.status),
    ['nacked'],
  )
  // m1 takes the window's one free push: it waits for its reservation, whose statement is under way
  // when m0's retry comes due (the stepped clock fires it now, before the statement can return).
  await s.produce(['m1'], 0, 0, true)
  s.clock.advance(1000)
  t.match(await s.pushed(2), { offset: 1, attempt: 1 }, 'the reserved message goes with the room it was promised')
  t.same(await countedNeverPushed(s), [], 'nothing reserved is left unpushed')
  t.match(await s.pushed(3), { offset: 0, attempt: 2 }, 'the retry once the window has room again')
  t.same(s.errors, [], 'no step failed')
})

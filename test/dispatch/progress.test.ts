/**
 * The progress writer (src/dispatch/progress.ts) and its statement (src/store/consumption.ts
 * writeProgress) against a real PostgreSQL: what a turn of the event loop queues goes out as one
 * statement; committed offsets move, completions above them are kept and those passed deleted;
 * a partition whose owner epoch moved on gets nothing written and is reported; a failed statement
 * fails every job of its batch and leaves memory as it was; dead letters land with their completion.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { ProgressWriter, type ProgressWriterDeps } from '../../src/dispatch/progress.ts'
import { newGroupRuntime, newPartitionState, type CompletionStatus, type PartitionState } from '../../src/dispatch/partition-state.ts'
import { GroupService } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { writeProgress, type ProgressBatch } from '../../src/store/consumption.ts'
import { openDatabase } from '../../src/store/db.ts'
import { claimPartition } from '../../src/store/membership.ts'
import { findTopicByName } from '../../src/store/topics.ts'
import { SteppedClock } from '../helpers/clock.ts'
import { testDatabase } from '../helpers/db.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, database.maxConnections)
t.teardown(() => db.close())
const topics = new TopicService(db)
const groups = new GroupService(db)

/** A group on a topic of two partitions, both claimed by "this process", and their in-memory states. */
async function setup(
  t: Test,
  name: string,
  dlq?: string,
  timing?: Pick<ProgressWriterDeps, 'linger' | 'now' | 'timers' | 'processes' | 'cpuBusy' | 'lazyMs'> & { onWrite?: () => void },
) {
  await topics.put(name, 2)
  if (dlq) await topics.put(dlq, 1)
  await groups.put(name, { topic: name, ...(dlq ? { deadLetterTopic: dlq } : {}) })
  const loaded = (await groups.load(name))!
  const topic = (await findTopicByName(db.prisma, name))!
  await groups.ensureOffsets(loaded.row, topic.id, 2)
  const g = newGroupRuntime(loaded.row, topic)
  const part = async (partition: number) =>
    newPartitionState(
      partition,
      { committed: 0, completed: new Set(), pushed: 0, seekedAtMs: 0 },
      new Map(),
      0,
      (await claimPartition(db.pool, g.row.id, partition))!,
    )
  const w0 = await part(0)
  const w1 = await part(1)
  g.parts.set(0, w0)
  g.parts.set(1, w1)
  const statements: ProgressBatch[] = []
  const refused: number[] = []
  const appended: { topicId: number; partition: number; endOffset: number }[] = []
  let failNext: Error | undefined
  const writer = new ProgressWriter({
    db,
    ...timing,
    onRefused: (_g, w) => refused.push(w.partition),
    onAppended: (topicId, partition, endOffset) => appended.push({ topicId, partition, endOffset }),
    write: async (d, batch) => {
      statements.push(batch)
      timing?.onWrite?.()
      if (failNext) {
        const err = failNext
        failNext = undefined
        throw err
      }
      return writeProgress(d, batch)
    },
  })
  t.teardown(() => writer.drain())
  const complete = (w: PartitionState, offset: number, outcome: 'acked' | 'dead' = 'acked', lazy = false) =>
    new Promise<CompletionStatus>((resolve, reject) => writer.complete({ g, w, offset, outcome }, resolve, reject, lazy))
  const reserve = (w: PartitionState, to: number | null) =>
    new Promise<boolean>((resolve, reject) => writer.reserve(g, w, to, resolve, reject))
  const stored = async () =>
    (
      await db.pool.query(
        `SELECT partition, committed_offset::int AS committed, pushed_offset::int AS pushed FROM group_offsets WHERE group_id = $1 ORDER BY partition`,
        [g.row.id],
      )
    ).rows
  const completions = async () =>
    (
      await db.pool.query(
        `SELECT partition, "offset"::int AS offset FROM group_completions WHERE group_id = $1 ORDER BY partition, "offset"`,
        [g.row.id],
      )
    ).rows
  return {
    g,
    w0,
    w1,
    writer,
    statements,
    refused,
    appended,
    complete,
    reserve,
    stored,
    completions,
    fail: (err: Error) => {
      failNext = err
    },
  }
}

t.test('one statement a turn: completions in and out of order, reservations, of two partitions', async (t) => {
  const s = await setup(t, 'batch')
  const results = await Promise.all([
    s.complete(s.w0, 0),
    s.complete(s.w0, 1),
    s.complete(s.w0, 3),
    s.complete(s.w1, 2),
    s.reserve(s.w0, 10),
    s.reserve(s.w1, 4),
  ])
  t.same(results, ['acked', 'acked', 'acked', 'acked', true, true])
  t.equal(s.statements.length, 1, 'all of it in one statement')
  t.same(await s.stored(), [
    { partition: 0, committed: 2, pushed: 10 },
    { partition: 1, committed: 0, pushed: 4 },
  ])
  t.same(
    await s.completions(),
    [
      { partition: 0, offset: 3 },
      { partition: 1, offset: 2 },
    ],
    'completions above the committed offset are kept',
  )
  t.equal(s.w0.committed, 2, 'memory follows')
  t.equal(s.w0.reservedTo, 10)
  t.same([...s.w0.completed], [3])

  // Offset 2 closes the gap: the committed offset passes 3, and 3's row goes.
  t.same(await s.complete(s.w0, 2), 'acked')
  t.same(await s.stored(), [
    { partition: 0, committed: 4, pushed: 10 },
    { partition: 1, committed: 0, pushed: 4 },
  ])
  t.same(await s.completions(), [{ partition: 1, offset: 2 }])
  t.same(
    await Promise.all([s.complete(s.w0, 1), s.complete(s.w1, 2)]),
    ['already_completed', 'already_completed'],
    'repeats change nothing',
  )
  t.same(await s.reserve(s.w0, 5), true, 'a reservation below the stored one is a check only')
  t.same(
    await s.stored(),
    [
      { partition: 0, committed: 4, pushed: 10 },
      { partition: 1, committed: 0, pushed: 4 },
    ],
    'offsets never move back',
  )
  // A retry's check of the fence, queued while the reservation here is lowered (a stalled
  // partition gives back what it never pushed): it checks, and raises nothing.
  s.w0.beginReservation()
  s.w0.lowerReservation(6)
  s.w0.endReservation()
  t.same(await s.reserve(s.w0, null), true, 'the fence is held')
  t.equal(s.w0.reservedTo, 6, 'a check of the fence leaves the reservation here as it is')
  t.same(s.statements.at(-1)!.partitions[0]!.pushedOffset, null, 'and writes none')
})

/** Lets `n` turns of the event loop pass (what a writer queues in a turn goes out at its end). */
async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((resolve) => setImmediate(resolve))
}

t.test('a busy writer waits for company; a quiet one does not; settled() does not wait', async (t) => {
  const clock = new SteppedClock(1_000_000)
  const s = await setup(t, 'linger', undefined, {
    linger: { ms: 50, minJobs: 3 },
    now: clock.now,
    timers: clock,
  })
  // Three jobs: a busy statement, written at once (nothing came before it).
  await Promise.all([s.complete(s.w0, 0), s.complete(s.w0, 1), s.reserve(s.w0, 5)])
  t.equal(s.statements.length, 1)
  // The next job waits out the 50 ms from that statement's start.
  let done = false
  const late = s.complete(s.w0, 2).then((status) => {
    done = true
    return status
  })
  await turns(20)
  t.equal(s.statements.length, 1, 'held back while the clock stands')
  t.equal(done, false)
  t.same(
    clock.pending.map((w) => w.atMs),
    [1_000_050],
    'one wait, to 50 ms after the busy statement started',
  )
  clock.fireNext()
  t.equal(await late, 'acked')
  t.equal(s.statements.length, 2)
  t.equal(s.statements[1]!.completions.length + s.statements[1]!.partitions.length, 1, 'the job that waited, alone')
  // That statement carried one job: the writer is quiet, and the next job goes at once.
  t.equal(await s.complete(s.w0, 3), 'acked')
  t.equal(s.statements.length, 3, 'no wait after a quiet statement')
  t.equal(clock.pending.length, 0)
  // Busy again, then settled() (shutdown, a handover) writes what waits without waiting.
  await Promise.all([s.complete(s.w0, 4), s.complete(s.w0, 5), s.complete(s.w1, 0)])
  const pending = s.complete(s.w1, 1)
  await turns(5)
  t.equal(clock.pending.length, 1, 'waiting')
  await s.writer.settled()
  t.equal(await pending, 'acked')
  t.equal(clock.pending.length, 0, 'the wait was cut short, its timer cleared')
  t.same(await s.stored(), [
    { partition: 0, committed: 6, pushed: 5 },
    { partition: 1, committed: 2, pushed: 0 },
  ])
})

t.test('a full writer waits for company only while the CPU is busy; with CPU to spare, as a quiet one', async (t) => {
  const clock = new SteppedClock(1_000_000)
  let cpuBusy = false
  let processes = 1
  const s = await setup(t, 'linger-cpu', undefined, {
    linger: { ms: 50, minJobs: 3 },
    cpuBusy: () => cpuBusy,
    processes: () => processes,
    now: clock.now,
    timers: clock,
    // Each statement takes 10 ms of the stepped clock.
    onWrite: () => clock.advance(10),
  })
  /** Writes a full statement (three jobs), then queues one more job: its statement and the wait it got. */
  const fullThenOne = async (offset: number, settings: { processes: number; cpuBusy: boolean }) => {
    // The writer decides a wait as a statement returns, after its jobs are answered: let the last
    // one's return pass before the settings change.
    await turns(5)
    // And time pass: no wait left from the last phase holds up the full statement.
    clock.advance(100)
    processes = settings.processes
    cpuBusy = settings.cpuBusy
    await Promise.all([s.complete(s.w0, offset), s.complete(s.w0, offset + 1), s.complete(s.w1, offset)])
    const fullStartedAt = clock.now() - 10
    await turns(5)
    const statements = s.statements.length
    const next = s.complete(s.w0, offset + 2)
    await turns(20)
    return { next, fullStartedAt, writtenAtOnce: s.statements.length > statements, waits: clock.pending.map((w) => w.atMs - fullStartedAt) }
  }
  // Alone, CPU to spare: the next job is written at once.
  const alone = await fullThenOne(0, { processes: 1, cpuBusy: false })
  t.ok(alone.writtenAtOnce, 'written at once after a full statement')
  t.same(alone.waits, [], 'no wait')
  while (clock.pending.length > 0) clock.fireNext() // (none: only so that a wrong wait fails the asserts above, not the timeout)
  t.equal(await alone.next, 'acked')
  // One of four processes, CPU to spare: as a quiet writer of four, four times the statement's 10 ms.
  const shared = await fullThenOne(3, { processes: 4, cpuBusy: false })
  t.notOk(shared.writtenAtOnce)
  t.same(shared.waits, [40], "a quiet writer's wait, not the linger's 50")
  clock.fireNext()
  t.equal(await shared.next, 'acked')
  // Alone, the CPU busy: the linger.
  const busy = await fullThenOne(6, { processes: 1, cpuBusy: true })
  t.notOk(busy.writtenAtOnce, 'held back while the clock stands')
  t.same(busy.waits, [50], 'one wait, to 50 ms after the full statement started')
  clock.fireNext()
  t.equal(await busy.next, 'acked')
  t.same(await s.stored(), [
    { partition: 0, committed: 9, pushed: 0 },
    { partition: 1, committed: 1, pushed: 0 },
  ])
})

t.test('with N processes sharing the load, a writer is busy from a Nth of the jobs', async (t) => {
  const clock = new SteppedClock(2_000_000)
  let processes = 4
  const s = await setup(t, 'linger-shared', undefined, {
    linger: { ms: 50, minJobs: 8 },
    processes: () => processes,
    now: clock.now,
    timers: clock,
  })
  /** Completes offsets of w0 and of w1 in one statement, then queues offset `next` of w0 and lets the turns pass: is its statement held? */
  const afterStatement = async (w0: number[], w1: number[], next: number) => {
    await Promise.all([...w0.map((o) => s.complete(s.w0, o)), ...w1.map((o) => s.complete(s.w1, o))])
    const pending = s.complete(s.w0, next)
    await turns(20)
    return { pending }
  }
  // Two jobs: quiet for a process alone (minJobs 8), busy for one of four (8 / 4).
  const { pending: held } = await afterStatement([0], [0], 1)
  t.equal(s.statements.length, 1, 'the next statement waits')
  t.same(
    clock.pending.map((w) => w.atMs),
    [2_000_050],
    'to 50 ms after the busy statement started',
  )
  clock.fireNext()
  t.equal(await held, 'acked')
  // The same two jobs for one of 2 processes are quiet (busy from 8 / 2 = 4): no wait.
  processes = 2
  const { pending: next } = await afterStatement([2], [1], 3)
  t.equal(clock.pending.length, 0, 'two jobs are quiet for one of two processes')
  t.equal(await next, 'acked')
  // Alone again, four jobs are quiet; for one of two processes, busy.
  processes = 1
  const { pending: alone } = await afterStatement([4, 5], [2, 3], 6)
  t.equal(clock.pending.length, 0, 'four jobs are quiet for a process alone')
  t.equal(await alone, 'acked')
  processes = 2
  const { pending: shared } = await afterStatement([7, 8], [4, 5], 9)
  t.same(
    clock.pending.map((w) => w.inMs),
    [50],
    'busy for one of two (8 / 2 = 4 jobs)',
  )
  await s.writer.settled()
  t.equal(await shared, 'acked')
  t.same(await s.stored(), [
    { partition: 0, committed: 10, pushed: 0 },
    { partition: 1, committed: 6, pushed: 0 },
  ])
})

t.test('with N processes, a quiet writer waits N times its last statement from its start, at most the linger', async (t) => {
  const clock = new SteppedClock(4_000_000)
  let processes = 2
  let statementMs = 4
  const s = await setup(t, 'linger-spaced', undefined, {
    linger: { ms: 50, minJobs: 1000 },
    processes: () => processes,
    now: clock.now,
    timers: clock,
    // Each statement takes statementMs on the writer's clock.
    onWrite: () => {
      clock.nowMs += statementMs
    },
  })
  /** A statement of the job at `offset`, then the next job: the waits before it (from the first one's start), and that job. */
  const waitsAfter = async (offset: number) => {
    const started = clock.nowMs
    t.equal(await s.complete(s.w0, offset), 'acked')
    const next = s.complete(s.w0, offset + 1)
    await turns(20)
    return { waits: clock.pending.map((w) => w.atMs - started), next }
  }
  // One of two processes: a quiet statement of 4 ms; the next starts 2 x 4 ms after it started.
  const two = await waitsAfter(0)
  t.same(two.waits, [8], 'two processes: twice the statement')
  t.equal(s.statements.length, 1, 'not written before the wait ends')
  clock.fireNext()
  t.equal(await two.next, 'acked')
  // One of four, a statement of 40 ms: 160 ms, capped at the linger's 50.
  processes = 4
  statementMs = 40
  clock.nowMs += 1000 // past the last statement's wait
  const four = await waitsAfter(2)
  t.same(four.waits, [50], 'at most the linger')
  clock.fireNext()
  t.equal(await four.next, 'acked')
  // A process alone writes as soon as its last statement returned, however long it took.
  processes = 1
  clock.nowMs += 1000
  const alone = await waitsAfter(4)
  t.same(alone.waits, [], 'no wait for a process alone')
  t.equal(await alone.next, 'acked')
  t.equal(s.statements.length, 6, 'a statement each')
})

t.test('lazy completions alone wait lazyMs for company; any other job takes them at once', async (t) => {
  const clock = new SteppedClock(2_000_000)
  const s = await setup(t, 'lazy', undefined, { linger: { ms: 50, minJobs: 64 }, lazyMs: 10, now: clock.now, timers: clock })
  const first = s.complete(s.w0, 0, 'acked', true)
  const second = s.complete(s.w0, 1, 'acked', true)
  await turns(20)
  t.equal(s.statements.length, 0, 'held back while the clock stands')
  t.same(
    clock.pending.map((w) => w.atMs),
    [2_000_010],
    'one wait of lazyMs',
  )
  clock.fireNext()
  t.same(await Promise.all([first, second]), ['acked', 'acked'])
  t.equal(s.statements.length, 1, 'both in one statement')
  // Waiting again; a reservation (a push waits on it) goes at the end of the turn and takes them along.
  const third = s.complete(s.w0, 2, 'acked', true)
  await turns(5)
  t.equal(clock.pending.length, 1, 'waiting')
  t.equal(await s.reserve(s.w0, 9), true, 'written without the clock moving')
  t.equal(await third, 'acked')
  t.equal(clock.pending.length, 0, 'the wait was cut short, its timer cleared')
  t.equal(s.statements.length, 2, 'one statement for both')
  // A completion something waits on (an ack call's) never waits.
  t.equal(await s.complete(s.w1, 0), 'acked')
  t.equal(s.statements.length, 3)
  t.same(await s.stored(), [
    { partition: 0, committed: 3, pushed: 9 },
    { partition: 1, committed: 1, pushed: 0 },
  ])
  // An ordered partition's job never waits, however lazy its caller thinks it is.
  s.g.row = { ...s.g.row, ordering: 'partition' }
  t.equal(await s.complete(s.w1, 1, 'acked', true), 'acked', 'written without the clock moving')
  t.equal(s.statements.length, 4)
})

t.test("an ordered partition's job cuts a busy writer's wait short", async (t) => {
  const clock = new SteppedClock(3_000_000)
  const s = await setup(t, 'linger-ordered', undefined, {
    linger: { ms: 50, minJobs: 2 },
    now: clock.now,
    timers: clock,
  })
  await Promise.all([s.complete(s.w0, 0), s.complete(s.w1, 0)])
  // Unordered, however full its maxInFlight: the job waits for company.
  s.g.row = { ...s.g.row, maxInFlight: 1 }
  ;(s.w1.outstanding as Map<number, never>).set(1, {} as never)
  const waiting = s.complete(s.w1, 1)
  await turns(20)
  t.equal(clock.pending.length, 1, 'a busy writer waits')
  t.equal(s.statements.length, 1)
  ;(s.w1.outstanding as Map<number, never>).clear()
  // Ordered: the partition's next message waits for this completion.
  s.g.row = { ...s.g.row, ordering: 'partition' }
  t.equal(await s.complete(s.w0, 1), 'acked', 'written without the clock moving')
  t.equal(await waiting, 'acked', 'the waiting job goes with it')
  t.equal(clock.pending.length, 0, 'the wait was cut short')
  t.equal(s.statements.length, 2)
  // The writer was busy (2 jobs): an ordered partition's next job does not wait either.
  t.equal(await s.complete(s.w1, 2), 'acked')
  t.equal(clock.pending.length, 0)
  t.equal(s.statements.length, 3)
})

t.test(
  "a reservation of a partition with nothing out cuts a busy writer's wait short; one with a message out (answered, not acked) waits",
  async (t) => {
    const clock = new SteppedClock(5_000_000)
    const s = await setup(t, 'linger-idle', undefined, {
      linger: { ms: 50, minJobs: 2 },
      now: clock.now,
      timers: clock,
    })
    await Promise.all([s.complete(s.w0, 0), s.complete(s.w1, 0)])
    // w1 has a message out with its consumer (a real attempt, sent): its reservation waits for company.
    const { o } = s.w1.admit(
      {
        offset: 1,
        key: null,
        value: '{}',
        headers: '{}',
        producedAtMs: 0,
        availableAtMs: 0,
        traceId: '',
        traceparent: null,
        tracestate: null,
      },
      true,
    )
    const a = s.w1.begin(o, 'attempt-1')
    s.w1.sending(o, a, 'c1')
    // Its consumer has answered but not acked yet (explicit mode): the message is still out.
    s.w1.answered(a)
    t.equal(s.w1.pushing(), false)
    t.equal(s.w1.engaged(), true)
    const waiting = s.reserve(s.w1, 3)
    await turns(20)
    t.equal(clock.pending.length, 1, 'a busy writer holds the reservation of a partition with a message out')
    t.equal(s.statements.length, 1)
    // w0 pushes nothing: its first pushes wait on this reservation alone, so it does not wait.
    t.equal(s.w0.engaged(), false)
    t.equal(await s.reserve(s.w0, 4), true, 'written without the clock moving')
    t.equal(await waiting, true, 'the waiting reservation goes with it')
    t.equal(clock.pending.length, 0, 'the wait was cut short, its timer cleared')
    t.equal(s.statements.length, 2)
    // The writer was busy (2 jobs), yet an idle partition's next reservation goes at once too.
    t.equal(await s.reserve(s.w0, 5), true)
    t.equal(clock.pending.length, 0)
    t.equal(s.statements.length, 3)
    t.same(await s.stored(), [
      { partition: 0, committed: 1, pushed: 5 },
      { partition: 1, committed: 1, pushed: 3 },
    ])
  },
)

t.test("a pull group's jobs never wait for company: a caller waits on each", async (t) => {
  const clock = new SteppedClock(4_000_000)
  const s = await setup(t, 'linger-pull', undefined, {
    linger: { ms: 50, minJobs: 2 },
    now: clock.now,
    timers: clock,
  })
  // Busy (2 jobs a statement), a push group's job waits 50 ms for company...
  await Promise.all([s.complete(s.w0, 0), s.complete(s.w1, 0)])
  const waiting = s.complete(s.w1, 1)
  await turns(20)
  t.equal(clock.pending.length, 1, 'a busy writer waits')
  // ...a pull group's does not (an ack call, a lease's reservation), and takes the waiting job along.
  s.g.row = { ...s.g.row, delivery: 'pull' }
  t.equal(await s.complete(s.w0, 1), 'acked', 'written without the clock moving')
  t.equal(await waiting, 'acked')
  t.equal(clock.pending.length, 0, 'the wait was cut short')
  // Busy again (2 jobs), the next pull statements do not wait either.
  t.same(await Promise.all([s.complete(s.w0, 2), s.reserve(s.w1, 5)]), ['acked', true])
  t.same(await Promise.all([s.complete(s.w0, 3), s.complete(s.w1, 2)]), ['acked', 'acked'])
  t.equal(clock.pending.length, 0, 'no wait')
  t.equal(s.statements.length, 4)
})

t.test('a partition whose owner epoch moved on is refused; the others are written', async (t) => {
  const s = await setup(t, 'fenced')
  await claimPartition(db.pool, s.g.row.id, 1) // another process (or a seek) took partition 1
  const [a, b, held] = await Promise.all([s.complete(s.w0, 0), s.complete(s.w1, 0), s.reserve(s.w1, 5)])
  t.same([a, b, held], ['acked', 'moved', false])
  t.same(s.refused, [1], 'the dispatcher is told')
  t.same(
    await s.stored(),
    [
      { partition: 0, committed: 1, pushed: 0 },
      { partition: 1, committed: 0, pushed: 0 },
    ],
    'nothing written for the fenced partition',
  )
  t.equal(s.w1.completed.size, 0, 'and nothing kept for it in memory')
})

t.test('a failed statement fails its whole batch and leaves memory as it was', async (t) => {
  const s = await setup(t, 'failed')
  s.fail(new Error('connection lost'))
  const outcomes = await Promise.allSettled([s.complete(s.w0, 0), s.reserve(s.w0, 3)])
  t.same(
    outcomes.map((o) => o.status),
    ['rejected', 'rejected'],
  )
  t.equal(s.w0.completed.size, 0)
  t.equal(s.w0.committed, 0)
  t.same(await s.stored(), [
    { partition: 0, committed: 0, pushed: 0 },
    { partition: 1, committed: 0, pushed: 0 },
  ])
  t.same(await s.complete(s.w0, 0), 'acked', 'the next write goes through')
})

t.test('a dead letter is appended in the same transaction as its completion', async (t) => {
  const s = await setup(t, 'dead', 'dead.dlq')
  const dlq = (await findTopicByName(db.prisma, 'dead.dlq'))!
  const status = await new Promise<CompletionStatus>((resolve, reject) =>
    s.writer.complete(
      {
        g: s.g,
        w: s.w0,
        offset: 0,
        outcome: 'dead',
        deadLetter: {
          topicId: dlq.id,
          partition: 0,
          key: 'k',
          value: '{"v":1}',
          headers: '{"hookq-dlq-topic":"dead"}',
          delayMs: 0,
          idempotencyKey: null,
          traceId: '0af7651916cd43dd8448eb211c80319c',
          traceparent: null,
          tracestate: null,
        },
      },
      resolve,
      reject,
    ),
  )
  t.equal(status, 'dead')
  t.same(s.appended, [{ topicId: dlq.id, partition: 0, endOffset: 1 }], "its topic's readers are woken")
  const rows = (await db.pool.query('SELECT key, value FROM messages WHERE topic_id = $1', [dlq.id])).rows
  t.same(rows, [{ key: 'k', value: '{"v":1}' }])
  t.same((await s.stored())[0], { partition: 0, committed: 1, pushed: 0 })
})

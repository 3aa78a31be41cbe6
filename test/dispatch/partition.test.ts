/**
 * The partition object alone: every move of a message its state table allows is made, every other
 * one is refused (and changes nothing), and the attempts, reads, reservations and completions keep
 * their rules. No database and no timers: the partition takes none, so the test steps its moves
 * one by one (the flows that drive it are test/dispatch/dispatcher.test.ts's, on a stepped clock).
 */
import { readFileSync } from 'node:fs'
import t from '../helpers/tap.ts'
import type { DispatchMessage } from '../../src/core/dispatch-message.ts'
import { IllegalMove, MOVES, Partition, type Outstanding, type State } from '../../src/dispatch/partition.ts'
import { TrackerEntry } from '../../src/dispatch/tracker.ts'
import { Wait } from '../../src/dispatch/waits.ts'
import { NO_TRACE } from '../helpers/messages.ts'

const STATES = Object.keys(MOVES) as State[]
/** What an illegal move throws. */
const ILLEGAL = { name: 'IllegalMove' }
const TARGETS = [...STATES, 'gone'] as const
type Target = (typeof TARGETS)[number]

const msg = (offset: number, key: string | null = null): DispatchMessage => ({
  offset,
  key,
  value: '1',
  headers: '{}',
  producedAtMs: 0,
  availableAtMs: 0,
  ...NO_TRACE,
})

const partition = (prior: [number, number][] = []) =>
  new Partition(0, { committed: 0, completed: new Set(), pushed: 100, seekedAtMs: 0 }, new Map(prior), 100, 1)

/** A partition with one message (offset 0) brought to `state` by legal moves only. */
function inState(state: State): { w: Partition; o: Outstanding } {
  const w = partition()
  const { o } = w.admit(msg(0), true)
  if (state === 'in_flight' || state === 'nacked') {
    const a = w.begin(o, 'd1')
    if (state === 'nacked') {
      w.sending(o, a, 'c1')
      w.nackDuringPush(o, a, { delayMs: undefined, deadLetter: false })
    }
  } else if (state === 'delayed') {
    w.waitFor(o, new Wait('delay', 1, 0, 0, 1000))
  } else if (state !== 'parked') {
    w.move(o, state)
  }
  return { w, o }
}

/** Tries the move by the method that makes it; true when it was made. */
function tryMove(w: Partition, o: Outstanding, to: Target): boolean {
  try {
    if (to === 'gone') w.forget(o, false)
    else if (to === 'in_flight') w.begin(o, 'd2')
    else if (to === 'nacked') {
      const a = o.current
      if (!a)
        w.move(o, 'nacked') // refused: nacked comes with a nacked attempt
      else {
        w.sending(o, a, 'c1')
        w.nackDuringPush(o, a, { delayMs: 0, deadLetter: false })
      }
    } else {
      if (o.current) w.settle(o, o.current, true)
      w.move(o, to)
    }
    return true
  } catch (err) {
    if (!(err instanceof IllegalMove)) throw err
    return false
  }
}

t.test('every move the table allows is made, every other one is refused and changes nothing', async (t) => {
  for (const from of STATES) {
    for (const to of TARGETS) {
      const { w, o } = inState(from)
      t.equal(o.state, from)
      const legal = MOVES[from].includes(to)
      const made = tryMove(w, o, to)
      t.equal(made, legal, `${from} → ${to} ${legal ? 'is made' : 'is refused'}`)
      if (to === 'gone') t.equal(w.outstanding.has(0), !made, made ? 'gone: no longer outstanding' : 'still outstanding')
      else t.equal(o.state, made ? to : from, made ? `now ${to}` : `still ${from}`)
      t.equal(w.ready.length, o.state === 'ready' && w.outstanding.has(0) ? 1 : 0, 'the ready queue follows')
      t.equal(w.delayed, o.state === 'delayed' && w.outstanding.has(0) ? 1 : 0, 'the delayed count follows')
    }
  }
})

t.test('the table in the header of partition.ts is the one enforced', async (t) => {
  const src = readFileSync(new URL('../../src/dispatch/partition.ts', import.meta.url), 'utf8')
  const header = src.slice(0, src.indexOf('*/'))
  const rows = header
    .split('\n')
    .map((l) => l.replace(/^\s*\*\s*/, '').trim())
    .filter((l) => STATES.some((s) => l.startsWith(`${s} `)))
    .map((l) => l.split(/\s+/))
  t.same(Object.fromEntries(rows.map(([from, ...to]) => [from, to])), MOVES)
})

t.test('attempts: begun in_flight, settled once, never two at a time', async (t) => {
  const w = partition([[0, 2]])
  const { o } = w.admit(msg(0), true)
  t.equal(o.attempts, 2, 'attempts made before this ownership count')
  const a = w.begin(o, 'd3')
  t.match(a, { id: 'd3', number: 3, open: true, pushing: false })
  t.equal(o.current, a)
  t.throws(() => w.begin(o, 'd4'), ILLEGAL, 'a second attempt before the first is settled')
  t.throws(() => w.move(o, 'retry_wait'), ILLEGAL, 'leaving in_flight with the attempt not settled')
  const deadline = new TrackerEntry({ deliveryId: 'd3', groupId: 1, partition: 0, offset: 0, attempt: 3, deadlineMs: 10 })
  w.setDeadline(o, a, deadline)
  t.equal(a.deadline, deadline)
  w.settle(o, a, true)
  t.equal(o.current, undefined)
  t.equal(a.deadline, undefined, 'a settled attempt has no deadline')
  t.notOk(a.open, 'a failure closes its row')
  t.throws(() => w.settle(o, a, true), ILLEGAL, 'settled twice')
  t.throws(() => w.setDeadline(o, a, deadline), ILLEGAL, 'a deadline for a settled attempt')
  w.move(o, 'retry_wait')
  const b = w.begin(o, 'd4')
  t.equal(b.number, 4)
  t.same(
    o.tries.map((x) => x.id),
    ['d3', 'd4'],
  )
  t.ok(w.issued(0, 'd3'), 'an attempt settled stays issued: a late ack of it still counts')
  t.notOk(w.issued(0, 'd9'))
  // Its row could not be written: the attempt did not happen.
  w.undo(o, b)
  t.equal(o.attempts, 3)
  t.same(
    o.tries.map((x) => x.id),
    ['d3'],
  )
  t.equal(o.current, undefined)
  t.throws(() => w.undo(o, a), ILLEGAL, 'only the current, latest attempt is undone')
})

t.test('each message has its own list of attempts', async (t) => {
  const w = partition()
  const { o: a } = w.admit(msg(0), true)
  const { o: b } = w.admit(msg(1), true)
  t.same(a.tries, [])
  w.begin(a, 'a1')
  t.same(b.tries, [], 'another message is untouched')
  t.throws(() => w.admit(msg(0), true), ILLEGAL, 'an offset admitted twice')
})

t.test('pushes: sent once, answered once; a nack during the push waits for the answer; a handover waits for the last', async (t) => {
  const w = partition()
  const { o } = w.admit(msg(0), true)
  const a = w.begin(o, 'd1')
  t.throws(() => w.nackDuringPush(o, a, { delayMs: 5, deadLetter: true }), ILLEGAL, 'no push under way to wait for')
  w.sending(o, a, 'c1')
  t.equal(o.pushedTo, 'c1')
  t.ok(w.pushing())
  t.throws(() => w.sending(o, a, 'c1'), ILLEGAL, 'sent twice')
  w.nackDuringPush(o, a, { delayMs: 5, deadLetter: true })
  t.equal(o.state, 'nacked')
  t.equal(o.current, undefined, 'the nack settled the attempt')
  let idle = 0
  t.ok(
    w.release(() => idle++),
    'a push under way: the handover waits',
  )
  t.ok(w.releasing)
  t.same(w.answered(a), { delayMs: 5, deadLetter: true }, 'the answer brings the nack')
  t.notOk(w.pushing())
  await new Promise((resolve) => queueMicrotask(() => resolve(undefined)))
  t.equal(idle, 1, 'told once the last push is answered')
  t.throws(() => w.answered(a), ILLEGAL, 'answered twice')
  t.notOk(
    partition().release(() => {}),
    'nothing under way: no wait',
  )
})

t.test('reads, reservations and completions', async (t) => {
  const w = partition()
  w.beginRead()
  t.throws(() => w.beginRead(), ILLEGAL, 'one read at a time')
  w.tookRows(0, 100, [msg(0), msg(1), msg(3)])
  t.notOk(w.reading)
  t.same(w.gaps, [[2, 3]], 'a hole is a retention gap')
  t.equal(w.nextToRead(), 4)
  t.throws(() => w.appendTail([msg(7)]), ILLEGAL, 'a tail must follow on')
  w.appendTail([msg(4)])
  t.equal(w.take()?.offset, 0)
  t.equal(w.readPos, 1)
  t.ok(w.markCompleted(1))
  t.notOk(w.markCompleted(1), 'completed already')
  t.equal(w.take(), undefined, 'a completed offset is skipped')
  t.equal(w.nextIncomplete(), 0)
  t.ok(w.markCompleted(0))
  t.equal(w.nextIncomplete(), 3, 'completions and the gap are passed')
  w.advance(3, 120)
  t.equal(w.committed, 3)
  t.same([...w.completed], [], 'offsets below the committed one are forgotten')
  t.same(w.gaps, [], 'and the gaps below it')
  t.equal(w.reservedTo, 120)
  w.advance(null, 110)
  t.equal(w.reservedTo, 120, 'a reservation never moves back')
  t.throws(() => w.lowerReservation(110), ILLEGAL, 'a reservation moves back only in a give-back holding the reservation')
  w.beginReservation()
  t.throws(() => w.beginReservation(), ILLEGAL, 'one reservation at a time')
  t.throws(() => w.lowerReservation(121), ILLEGAL, 'a give-back never moves it forward')
  t.throws(() => w.lowerReservation(2), ILLEGAL, 'nor below the committed offset')
  w.beginAppendReservation(1)
  t.throws(() => w.lowerReservation(110), ILLEGAL, 'nor while an append reserves')
  w.endAppendReservation(1, null)
  w.lowerReservation(110)
  t.equal(w.reservedTo, 110, 'given back to the first offset never pushed')
  w.endReservation()
  const { o } = w.admit(msg(5), true)
  w.move(o, 'ready')
  const dropped = w.drop()
  t.same(
    dropped.map((x) => x.msg.offset),
    [5],
  )
  t.ok(w.dropped)
  t.same(w.ready, [])
  t.equal(w.outstanding.size, 0)
  t.throws(() => w.move(o, 'parked'), ILLEGAL, 'a message of a dropped partition moves no more')
})

t.test('ordering "key": a completed message hands its key to the next', async (t) => {
  const w = partition()
  const first = msg(0, 'k')
  t.ok(w.takeKey(first))
  t.notOk(w.takeKey(msg(1, 'k')), 'waits behind its key')
  const { o } = w.admit(first, true)
  t.throws(() => w.forget(o, true), ILLEGAL, 'not before it is completing')
  t.ok(w.keyBusy('k'), 'the key stays held')
  w.move(o, 'completing')
  t.equal(w.forget(o, true)?.offset, 1, 'the next of its key')
  t.notOk(w.outstanding.has(0))
})

t.test('firstUnpushed: an attempt begun but never sent is given back; a count resting on rows need not hold the reservation', async (t) => {
  // The last owner gave the reservation back to 10; offset 11 was pushed then (its row counts it),
  // offsets below 10 were counted by the reservation alone (8) or by rows (9).
  const at = (reservedOnly?: Set<number>) => {
    const w = new Partition(
      0,
      { committed: 8, completed: new Set(), pushed: 10, seekedAtMs: 0 },
      new Map([
        [8, 1],
        [9, 1],
        [11, 1],
      ]),
      20,
      1,
      new Map(),
      reservedOnly,
    )
    w.advance(null, 13) // first pushes of 10 and 12 reserved here
    // Taken from the log up to 12 (messages are admitted as they are taken).
    w.beginRead()
    w.tookRows(
      8,
      20,
      [8, 9, 10, 11, 12].map((offset) => msg(offset)),
    )
    for (let i = 0; i < 5; i++) w.take()
    const o10 = w.admit(msg(10), true).o
    const a10 = w.begin(o10, 'a10')
    w.sending(o10, a10, 'c1') // queued for a connection: not sent
    w.admit(msg(11), true) // counted before, not pushed here yet
    const o12 = w.admit(msg(12), true).o
    w.went(w.begin(o12, 'a12'))
    return { w, o10, a10 }
  }
  const { w, a10 } = at(new Set([8]))
  t.same([...w.unsent], ['a10'], 'only the attempt not sent is unsent')
  t.equal(w.firstUnpushed(), 10, 'offset 10 never went: the reservation goes back to it (11 keeps its row)')
  t.equal(w.firstUnpushed(true), 13, 'while the ownership goes on, an attempt not sent yet may still go: it counts')
  t.equal(at().w.firstUnpushed(), 12, 'not knowing what rests on rows, it stays above every count from before')
  w.went(a10)
  t.equal(w.firstUnpushed(), 13, 'once sent, offset 10 counts')
  t.equal(w.unsent.size, 0)
  const gone = at(new Set([8, 11]))
  t.equal(gone.w.firstUnpushed(), 12, 'a count on the reservation alone stays below it')
  // Reserved past what was taken from the log (an append reserved its messages: push-flow.ts
  // appendRoom) and released before they were taken: never pushed here, given back.
  const ahead = at(new Set([8]))
  ahead.w.went(ahead.a10)
  ahead.w.advance(null, 16)
  t.equal(ahead.w.firstUnpushed(), 13, 'offsets not taken from the log are given back')
  // A message settled while an attempt of it never went (a late ack of the one before): once it is
  // forgotten, nothing of it stays unsent for a handover to give back.
  const late = at()
  late.w.settle(late.o10, late.a10, true)
  late.w.move(late.o10, 'completing')
  late.w.forget(late.o10, false)
  t.same([...late.w.unsent], [], 'a forgotten message leaves no unsent attempt behind')
})

t.test('maxInFlight counts the messages out with their consumer: one being completed frees its slot, up to twice the limit held', (t) => {
  const w = partition()
  const out = [0, 1, 2].map((offset) => w.admit(msg(offset), true).o)
  for (const o of out) w.settle(o, w.begin(o, `d${o.msg.offset}`), true)
  t.equal(w.active(), 3, 'settled and waiting for what follows: they hold their slots')
  t.notOk(w.hasRoom(3))
  w.move(out[0]!, 'completing')
  w.move(out[1]!, 'completing')
  t.equal(w.completing, 2)
  t.equal(w.active(), 1, 'two being completed no longer count')
  t.ok(w.hasRoom(2), 'a slot is free, and 3 held are fewer than twice the limit 2')
  w.move(out[2]!, 'completing')
  t.equal(w.active(), 0)
  t.ok(w.hasRoom(2))
  const more = w.admit(msg(3), true).o
  t.notOk(w.hasRoom(2), 'a slot is free, but 4 held is twice the limit: the writer is behind')
  w.forget(out[0]!, false)
  t.equal(w.completing, 2, 'a completion written leaves')
  t.ok(w.hasRoom(2))
  w.move(out[1]!, 'retry_wait')
  t.equal(w.completing, 1, 'a completion that failed counts again, waiting for its retry')
  t.equal(w.active(), 2)
  w.move(more, 'ready')
  t.equal(w.active(), 1, 'a ready message waits for a slot')
  w.drop()
  t.equal(w.completing, 0)
  t.end()
})

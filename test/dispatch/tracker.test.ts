import t from 'tap'
import { InFlightTracker, TrackerEntry, type TrackerEntryInit } from '../../src/dispatch/tracker.ts'
import { mulberry32 } from '../helpers/prng.ts'

function entry(deliveryId: string, deadlineMs: number, more: Partial<TrackerEntryInit> = {}): TrackerEntry {
  return new TrackerEntry({ deliveryId, groupId: 1, partition: 0, offset: 0, attempt: 1, deadlineMs, ...more })
}

function ids(entries: TrackerEntry[]): string[] {
  return entries.map((e) => e.deliveryId)
}

t.test('an empty tracker', async (t) => {
  const tracker = new InFlightTracker()
  t.equal(tracker.size, 0)
  t.equal(tracker.nextDeadlineMs(), undefined)
  t.same(tracker.expireDue(Number.MAX_SAFE_INTEGER), { due: [], nextDeadlineMs: undefined })
  t.equal(tracker.get('x'), undefined)
  t.equal(tracker.has('x'), false)
  t.equal(tracker.finish('x'), undefined)
  t.equal(tracker.touch('x', 5), false)
  tracker.checkInvariant()
})

t.test('insert, get, has, size; a duplicate id throws and changes nothing', async (t) => {
  const tracker = new InFlightTracker()
  const a = entry('a', 100, { groupId: 7, partition: 3, offset: 41, attempt: 2 })
  t.equal(tracker.insert(a), a)
  tracker.insert(entry('b', 50))
  t.equal(tracker.get('a'), a)
  t.match(tracker.get('a'), { deliveryId: 'a', groupId: 7, partition: 3, offset: 41, attempt: 2, deadlineMs: 100, index: 1 })
  t.equal(tracker.has('a'), true)
  t.equal(tracker.size, 2)
  t.equal(tracker.nextDeadlineMs(), 50)
  t.throws(() => tracker.insert(entry('a', 1)), /already tracked/)
  t.equal(tracker.get('a'), a, 'the original stays')
  t.equal(tracker.size, 2)
  t.equal(tracker.nextDeadlineMs(), 50, 'the duplicate did not reach the heap')
  const other = new InFlightTracker()
  t.throws(() => other.insert(a), /already in a heap/, 'an entry tracked elsewhere')
  t.equal(other.size, 0)
  tracker.checkInvariant()
  other.checkInvariant()
})

t.test('finish removes an entry; unknown and repeated ids give undefined', async (t) => {
  const tracker = new InFlightTracker()
  const a = tracker.insert(entry('a', 10))
  const b = tracker.insert(entry('b', 20))
  tracker.insert(entry('c', 30))
  t.equal(tracker.finish('nope'), undefined)
  t.equal(tracker.finish('a'), a)
  t.equal(a.index, -1)
  t.equal(tracker.finish('a'), undefined, 'already finished')
  t.equal(tracker.nextDeadlineMs(), 20)
  t.equal(tracker.finish('b'), b)
  t.equal(tracker.size, 1)
  t.equal(tracker.nextDeadlineMs(), 30)
  tracker.checkInvariant()
  tracker.insert(a)
  t.equal(tracker.nextDeadlineMs(), 10, 'a finished entry can be inserted again')
  tracker.checkInvariant()
})

t.test('touch moves a deadline either way; not one that was finished or expired', async (t) => {
  const tracker = new InFlightTracker()
  tracker.insert(entry('a', 10))
  tracker.insert(entry('b', 20))
  tracker.insert(entry('c', 15))
  t.equal(tracker.touch('a', 100), true)
  t.equal(tracker.get('a')!.deadlineMs, 100)
  t.equal(tracker.nextDeadlineMs(), 15)
  t.equal(tracker.touch('a', 1), true, 'earlier is allowed too')
  t.equal(tracker.nextDeadlineMs(), 1)
  const finished = tracker.finish('c')!
  t.equal(tracker.touch('c', 1000), false, 'finished (acked or nacked): the attempt is over, nothing to extend')
  t.equal(finished.deadlineMs, 15, 'and the untracked entry is left alone')
  const [expired] = tracker.expireDue(1).due
  t.equal(expired!.deliveryId, 'a')
  t.equal(tracker.touch('a', 1000), false, 'expired: the attempt timed out')
  t.equal(expired!.deadlineMs, 1)
  t.equal(tracker.touch('unknown', 5), false)
  t.equal(tracker.nextDeadlineMs(), 20)
  tracker.checkInvariant()
})

t.test('expireDue: order, boundary, equal deadlines, limit, next deadline', async (t) => {
  const tracker = new InFlightTracker()
  for (const [id, deadlineMs] of [
    ['d', 40],
    ['a', 10],
    ['c', 30],
    ['b1', 20],
    ['b2', 20],
    ['b3', 20],
    ['e', 50],
  ] as const) {
    tracker.insert(entry(id, deadlineMs))
  }
  t.same(tracker.expireDue(9), { due: [], nextDeadlineMs: 10 }, 'nothing due yet')
  const first = tracker.expireDue(10)
  t.same(ids(first.due), ['a'], 'deadline equal to now is due')
  t.equal(first.nextDeadlineMs, 20)
  const limited = tracker.expireDue(35, 2)
  t.equal(limited.due.length, 2)
  t.ok(limited.due.every((e) => e.deadlineMs === 20 && e.index === -1 && !tracker.has(e.deliveryId)))
  t.equal(limited.nextDeadlineMs, 20, 'the limit left a due entry: next deadline is already past')
  const rest = tracker.expireDue(35)
  t.same(
    rest.due.map((e) => e.deadlineMs),
    [20, 30],
  )
  t.same(new Set([...ids(limited.due), ...ids(rest.due)]), new Set(['b1', 'b2', 'b3', 'c']), 'each tie exactly once')
  t.equal(rest.nextDeadlineMs, 40)
  t.same(tracker.expireDue(100, 0), { due: [], nextDeadlineMs: 40 }, 'limit 0')
  t.throws(() => tracker.expireDue(100, -1), RangeError)
  t.throws(() => tracker.expireDue(100, NaN), RangeError)
  const all = tracker.expireDue(1000)
  t.same(ids(all.due), ['d', 'e'])
  t.equal(all.nextDeadlineMs, undefined)
  t.equal(tracker.size, 0)
  tracker.checkInvariant()
})

t.test('an expired entry is untracked: it may be edited and inserted again', async (t) => {
  const tracker = new InFlightTracker()
  tracker.insert(entry('a', 10))
  const [expired] = tracker.expireDue(10).due
  t.equal(expired!.index, -1)
  expired!.deadlineMs = 2010
  t.equal(tracker.insert(expired!), expired)
  t.equal(tracker.size, 1)
  t.equal(tracker.nextDeadlineMs(), 2010)
  tracker.checkInvariant()
})

interface ModelEntry {
  deadlineMs: number
  /** Unique per inserted entry (the step that made it): tells a returned entry from another with the same id. */
  offset: number
}

/** One random run: every operation on the tracker and on a Map scanned linearly, compared after each step. */
function randomRun(seed: number, steps: number): string | undefined {
  const random = mulberry32(seed)
  const pick = (n: number) => Math.floor(random() * n)
  const tracker = new InFlightTracker()
  const model = new Map<string, ModelEntry>()
  let nowMs = 1_700_000_000_000
  let nextId = 0
  // Deadlines on a 10 ms grid so that equal deadlines are common; a 4 s window with a clock that
  // advances ~15 ms per expireDue keeps ~120-130 entries (a heap ~7 levels deep).
  const deadline = () => nowMs + 10 * pick(400)
  const someId = () => {
    if (model.size > 0 && random() < 0.9) {
      const keys = [...model.keys()]
      return keys[pick(keys.length)]!
    }
    return `id-${pick(nextId + 5)}` // mostly finished or never issued
  }
  for (let step = 0; step < steps; step++) {
    const op = random()
    let what = ''
    try {
      if (op < 0.35 || model.size === 0) {
        const reuse = random() < 0.05 && model.size > 0
        const id = reuse ? someId() : `id-${nextId++}`
        const init = {
          deliveryId: id,
          groupId: pick(3),
          partition: pick(4),
          offset: step,
          attempt: 1 + pick(5),
          deadlineMs: deadline(),
        }
        what = `insert ${id}`
        let threw = false
        try {
          tracker.insert(new TrackerEntry(init))
        } catch {
          threw = true
        }
        if (threw !== model.has(id)) return `step ${step} ${what}: threw=${threw}, model has it=${model.has(id)}`
        if (!threw) model.set(id, { deadlineMs: init.deadlineMs, offset: init.offset })
      } else if (op < 0.52) {
        const id = someId()
        what = `finish ${id}`
        const got = tracker.finish(id)
        const expected = model.get(id)
        if ((got === undefined) !== (expected === undefined))
          return `step ${step} ${what}: got ${got?.deliveryId}, model ${expected?.offset}`
        if (got !== undefined && (got.offset !== expected!.offset || got.deadlineMs !== expected!.deadlineMs || got.index !== -1))
          return `step ${step} ${what}: wrong entry`
        model.delete(id)
      } else if (op < 0.72) {
        const id = someId()
        const deadlineMs = deadline()
        what = `touch ${id} ${deadlineMs}`
        const expected = model.has(id)
        if (tracker.touch(id, deadlineMs) !== expected) return `step ${step} ${what}: expected ${expected}`
        if (expected) model.get(id)!.deadlineMs = deadlineMs
      } else {
        nowMs += pick(30)
        const limit = random() < 0.5 ? Infinity : pick(6)
        what = `expireDue ${nowMs} limit ${limit}`
        const { due, nextDeadlineMs } = tracker.expireDue(nowMs, limit)
        const modelDue = [...model.values()].filter((m) => m.deadlineMs <= nowMs)
        if (due.length !== Math.min(limit, modelDue.length)) return `step ${step} ${what}: ${due.length} due, model ${modelDue.length}`
        for (let i = 0; i < due.length; i++) {
          const e = due[i]!
          const m = model.get(e.deliveryId)
          if (m === undefined || m.deadlineMs !== e.deadlineMs || m.offset !== e.offset || e.deadlineMs > nowMs)
            return `step ${step} ${what}: unexpected ${e.deliveryId}`
          if (i > 0 && due[i - 1]!.deadlineMs > e.deadlineMs) return `step ${step} ${what}: out of order at ${i}`
          if (e.index !== -1 || tracker.has(e.deliveryId)) return `step ${step} ${what}: ${e.deliveryId} still tracked`
        }
        // Everything strictly earlier than the last returned deadline must have come out (ties may split).
        const lastMs = due.at(-1)?.deadlineMs ?? -Infinity
        const dueIds = new Set(ids(due))
        for (const [id, m] of model) if (m.deadlineMs < lastMs && !dueIds.has(id)) return `step ${step} ${what}: skipped earlier ${id}`
        for (const e of due) model.delete(e.deliveryId)
        const modelNext = model.size === 0 ? undefined : Math.min(...[...model.values()].map((m) => m.deadlineMs))
        if (nextDeadlineMs !== modelNext) return `step ${step} ${what}: next ${nextDeadlineMs}, model ${modelNext}`
      }
      // The whole state, after every step.
      tracker.checkInvariant()
      if (tracker.size !== model.size) return `step ${step} ${what}: size ${tracker.size}, model ${model.size}`
      for (const [id, m] of model) {
        const e = tracker.get(id)
        if (e === undefined || e.offset !== m.offset || e.deadlineMs !== m.deadlineMs) return `step ${step} ${what}: ${id} differs`
      }
      const modelNext = model.size === 0 ? undefined : Math.min(...[...model.values()].map((m) => m.deadlineMs))
      if (tracker.nextDeadlineMs() !== modelNext)
        return `step ${step} ${what}: nextDeadlineMs ${tracker.nextDeadlineMs()}, model ${modelNext}`
    } catch (err) {
      return `step ${step} ${what}: ${String(err)}`
    }
  }
  return undefined
}

t.test('random operations against a naive model', async (t) => {
  const seeds =
    process.env.SEED !== undefined ? [Number(process.env.SEED)] : Array.from({ length: 4 }, () => Math.floor(Math.random() * 2 ** 32))
  const steps = Number(process.env.STEPS ?? 10_000)
  for (const seed of seeds) {
    const failure = randomRun(seed, steps)
    if (failure !== undefined) t.fail(`SEED=${seed} (replay: SEED=${seed} npx tap test/dispatch/tracker.test.ts): ${failure}`)
    else t.pass(`${steps} random operations match the model (SEED=${seed})`)
  }
})

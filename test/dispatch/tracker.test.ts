import t from '../helpers/tap.ts'
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
  t.same(tracker.expireDue(Number.MAX_SAFE_INTEGER), [])
  t.equal(tracker.has('x'), false)
  t.equal(tracker.finish('x'), false)
  t.equal(tracker.touch('x', 5), false)
  tracker.checkInvariant()
})

t.test('insert, has, size; a duplicate id throws and changes nothing', async (t) => {
  const tracker = new InFlightTracker()
  const a = entry('a', 100, { groupId: 7, partition: 3, offset: 41, attempt: 2 })
  t.equal(tracker.insert(a), a)
  tracker.insert(entry('b', 50))
  t.match(a, { deliveryId: 'a', groupId: 7, partition: 3, offset: 41, attempt: 2, deadlineMs: 100, index: 1 })
  t.equal(tracker.has('a'), true)
  t.equal(tracker.size, 2)
  t.equal(tracker.nextDeadlineMs(), 50)
  const duplicate = entry('a', 1)
  t.throws(() => tracker.insert(duplicate), /already tracked/)
  t.equal(duplicate.index, -1, 'the duplicate did not reach the heap')
  t.equal(a.index, 1, 'the original stays')
  t.equal(tracker.size, 2)
  t.equal(tracker.nextDeadlineMs(), 50)
  const other = new InFlightTracker()
  t.throws(() => other.insert(a), /already in a heap/, 'an entry tracked elsewhere')
  t.equal(other.size, 0)
  t.equal(other.has('a'), false)
  tracker.checkInvariant()
  other.checkInvariant()
})

t.test('finish removes an entry; unknown and repeated ids give false', async (t) => {
  const tracker = new InFlightTracker()
  const a = tracker.insert(entry('a', 10))
  const b = tracker.insert(entry('b', 20))
  tracker.insert(entry('c', 30))
  t.equal(tracker.finish('nope'), false)
  t.equal(tracker.finish('a'), true)
  t.equal(a.index, -1)
  t.equal(tracker.has('a'), false)
  t.equal(tracker.finish('a'), false, 'already finished')
  t.equal(tracker.nextDeadlineMs(), 20)
  t.equal(tracker.finish('b'), true)
  t.equal(b.index, -1)
  t.equal(tracker.size, 1)
  t.equal(tracker.nextDeadlineMs(), 30)
  tracker.checkInvariant()
  tracker.insert(a)
  t.equal(tracker.nextDeadlineMs(), 10, 'a finished entry can be inserted again')
  tracker.checkInvariant()
})

t.test('touch moves a deadline either way; not one that was finished or expired', async (t) => {
  const tracker = new InFlightTracker()
  const a = tracker.insert(entry('a', 10))
  tracker.insert(entry('b', 20))
  const c = tracker.insert(entry('c', 15))
  t.equal(tracker.touch('a', 100), true)
  t.equal(a.deadlineMs, 100)
  t.equal(tracker.nextDeadlineMs(), 15)
  t.equal(tracker.touch('a', 1), true, 'earlier is allowed too')
  t.equal(tracker.nextDeadlineMs(), 1)
  tracker.finish('c')
  t.equal(tracker.touch('c', 1000), false, 'finished (acked or nacked): the attempt is over, nothing to extend')
  t.equal(c.deadlineMs, 15, 'and the untracked entry is left alone')
  t.same(tracker.expireDue(1), [a])
  t.equal(tracker.touch('a', 1000), false, 'expired: the attempt timed out')
  t.equal(a.deadlineMs, 1)
  t.equal(tracker.touch('unknown', 5), false)
  t.equal(tracker.nextDeadlineMs(), 20)
  tracker.checkInvariant()
})

t.test('expireDue: order, boundary, equal deadlines, limit', async (t) => {
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
  t.same(tracker.expireDue(9), [], 'nothing due yet')
  t.equal(tracker.nextDeadlineMs(), 10)
  t.same(ids(tracker.expireDue(10)), ['a'], 'deadline equal to now is due')
  t.equal(tracker.nextDeadlineMs(), 20)
  const limited = tracker.expireDue(35, 2)
  t.equal(limited.length, 2)
  t.ok(limited.every((e) => e.deadlineMs === 20 && e.index === -1 && !tracker.has(e.deliveryId)))
  t.equal(tracker.nextDeadlineMs(), 20, 'the limit left a due entry: the next deadline is already past')
  const rest = tracker.expireDue(35)
  t.same(
    rest.map((e) => e.deadlineMs),
    [20, 30],
  )
  t.same(new Set([...ids(limited), ...ids(rest)]), new Set(['b1', 'b2', 'b3', 'c']), 'each tie exactly once')
  t.equal(tracker.nextDeadlineMs(), 40)
  t.same(tracker.expireDue(100, 0), [], 'limit 0')
  t.equal(tracker.size, 2)
  t.throws(() => tracker.expireDue(100, -1), RangeError)
  t.throws(() => tracker.expireDue(100, NaN), RangeError)
  t.same(ids(tracker.expireDue(1000)), ['d', 'e'])
  t.equal(tracker.nextDeadlineMs(), undefined)
  t.equal(tracker.size, 0)
  tracker.checkInvariant()
})

t.test('an expired entry is untracked: it may be edited and inserted again', async (t) => {
  const tracker = new InFlightTracker()
  const a = tracker.insert(entry('a', 10))
  t.same(tracker.expireDue(10), [a])
  t.equal(a.index, -1)
  a.deadlineMs = 2010
  t.equal(tracker.insert(a), a)
  t.equal(tracker.size, 1)
  t.equal(tracker.nextDeadlineMs(), 2010)
  tracker.checkInvariant()
})

interface ModelEntry {
  /** The deadline as the model keeps it (the entry's own field is the tracker's to write). */
  deadlineMs: number
  /** The object inserted, held as the dispatcher holds its entry: a returned entry must be this one. */
  entry: TrackerEntry
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
        const inserted = new TrackerEntry(init)
        let threw = false
        try {
          tracker.insert(inserted)
        } catch {
          threw = true
        }
        if (threw !== model.has(id)) return `step ${step} ${what}: threw=${threw}, model has it=${model.has(id)}`
        if (!threw) model.set(id, { deadlineMs: init.deadlineMs, entry: inserted })
      } else if (op < 0.52) {
        const id = someId()
        what = `finish ${id}`
        const m = model.get(id)
        if (tracker.finish(id) !== (m !== undefined)) return `step ${step} ${what}: expected ${m !== undefined}`
        if (m !== undefined && (m.entry.index !== -1 || m.entry.deadlineMs !== m.deadlineMs)) return `step ${step} ${what}: wrong entry`
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
        const due = tracker.expireDue(nowMs, limit)
        const modelDue = [...model.values()].filter((m) => m.deadlineMs <= nowMs)
        if (due.length !== Math.min(limit, modelDue.length)) return `step ${step} ${what}: ${due.length} due, model ${modelDue.length}`
        for (let i = 0; i < due.length; i++) {
          const e = due[i]!
          const m = model.get(e.deliveryId)
          if (m === undefined || m.entry !== e || m.deadlineMs !== e.deadlineMs || e.deadlineMs > nowMs)
            return `step ${step} ${what}: unexpected ${e.deliveryId}`
          if (i > 0 && due[i - 1]!.deadlineMs > e.deadlineMs) return `step ${step} ${what}: out of order at ${i}`
          if (e.index !== -1 || tracker.has(e.deliveryId)) return `step ${step} ${what}: ${e.deliveryId} still tracked`
        }
        // Everything strictly earlier than the last returned deadline must have come out (ties may split).
        const lastMs = due.at(-1)?.deadlineMs ?? -Infinity
        const dueIds = new Set(ids(due))
        for (const [id, m] of model) if (m.deadlineMs < lastMs && !dueIds.has(id)) return `step ${step} ${what}: skipped earlier ${id}`
        for (const e of due) model.delete(e.deliveryId)
      }
      // The whole state, after every step. The invariant makes the Map's entries the heap's; an
      // entry with an index is in the heap (the only one here), so under its id in the Map; and with
      // every model id tracked and the sizes equal, the tracked ids are the model's.
      tracker.checkInvariant()
      if (tracker.size !== model.size) return `step ${step} ${what}: size ${tracker.size}, model ${model.size}`
      for (const [id, m] of model) {
        if (!tracker.has(id) || m.entry.index === -1 || m.entry.deadlineMs !== m.deadlineMs) return `step ${step} ${what}: ${id} differs`
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

// The batching logic alone, with a commit function that records its calls: the database side of
// group commit is exercised by the produce tests against PostgreSQL.
import t from '../helpers/tap.ts'
import { GroupCommitter } from '../../src/service/group-commit.ts'

function deferred() {
  let resolve!: () => void
  const promise = new Promise<void>((r) => {
    resolve = r
  })
  return { promise, resolve }
}

const limits = { maxBatchMessages: 10, maxConcurrentCommits: 1, maxPendingMessages: 25, maxPendingBytes: 1_000 }

t.test('calls that arrive during a commit are committed together, each getting its own results', async (t) => {
  const batches: number[][] = []
  const gate = deferred()
  const gc = new GroupCommitter<number, string>(async (entries) => {
    batches.push(entries)
    if (batches.length === 1) await gate.promise
    return entries.map((e) => `r${e}`)
  }, limits)
  const first = gc.submit([1], 1)
  const waiting = [gc.submit([2, 3], 1), gc.submit([4], 1), gc.submit([5, 6, 7], 1)]
  t.equal(gc.backlog, 6)
  gate.resolve()
  t.same(await first, ['r1'])
  t.same(await Promise.all(waiting), [['r2', 'r3'], ['r4'], ['r5', 'r6', 'r7']])
  t.same(batches, [[1], [2, 3, 4, 5, 6, 7]], 'one commit for the three waiting calls')
})

t.test('a batch never exceeds maxBatchMessages, and a call is never split', async (t) => {
  const batches: number[][] = []
  const gate = deferred()
  const gc = new GroupCommitter<number, number>(async (entries) => {
    batches.push(entries)
    if (batches.length === 1) await gate.promise
    return entries
  }, limits)
  const calls = [gc.submit([0], 1)]
  for (let i = 0; i < 4; i++) calls.push(gc.submit([i * 4 + 1, i * 4 + 2, i * 4 + 3, i * 4 + 4], 1))
  gate.resolve()
  await Promise.all(calls)
  t.same(
    batches.map((b) => b.length),
    [1, 8, 8],
  )
})

t.test('past the backlog limit, submit refuses at once with 503 and Retry-After', async (t) => {
  const gate = deferred()
  const gc = new GroupCommitter<number, number>(async (e) => {
    await gate.promise
    return e
  }, limits)
  const inFlight = gc.submit([0], 1)
  const queued = gc.submit(new Array(25).fill(1), 10)
  await t.rejects(gc.submit([1], 1), { code: 'overloaded', status: 503, retryAfterS: 1 })
  const bytes = new GroupCommitter<number, number>(async (e) => {
    await gate.promise
    return e
  }, limits)
  const first = bytes.submit([0], 1) // in flight at once
  const large = bytes.submit([1], 2_000) // an empty queue takes even an oversized call
  await t.rejects(bytes.submit([2], 1), { code: 'overloaded' }, 'bytes over the limit')
  gate.resolve()
  await Promise.all([inFlight, queued, first, large])
  t.same(await gc.submit([9], 1), [9], 'accepts again once the backlog is committed')
})

t.test('a failed commit fails every call in it and the next batch still runs', async (t) => {
  let n = 0
  const gate = deferred()
  const gc = new GroupCommitter<number, number>(async (e) => {
    n++
    if (n === 1) {
      await gate.promise
      return e
    }
    if (n === 2) throw new Error('database went away')
    return e
  }, limits)
  const a = gc.submit([1], 1)
  const b = gc.submit([2], 1)
  const c = gc.submit([3], 1)
  gate.resolve()
  await a
  await t.rejects(b, /database went away/)
  await t.rejects(c, /database went away/)
  t.same(await gc.submit([4], 1), [4])
})

t.test('drain waits for queued calls, then refuses new ones', async (t) => {
  const gate = deferred()
  const committed: number[] = []
  const gc = new GroupCommitter<number, number>(
    async (e) => {
      await gate.promise
      committed.push(...e)
      return e
    },
    { ...limits, maxConcurrentCommits: 2 },
  )
  const calls = [gc.submit([1], 1), gc.submit([2], 1), gc.submit([3], 1)]
  const drained = gc.drain()
  await t.rejects(gc.submit([4], 1), { code: 'unavailable' })
  gate.resolve()
  await drained
  t.same(committed.sort(), [1, 2, 3])
  await Promise.all(calls)
  await gc.drain()
})

t.test(
  'with keyOf, a commit starts beside running ones of a call each, only for calls of keys they do not hold, in call order',
  async (t) => {
    // Entries are [key, value]; the key is what commits conflict on (produce: the partition).
    const started: number[][] = []
    const gates: (() => void)[] = []
    const gc = new GroupCommitter<[number, number], number>(
      (entries) => {
        started.push(entries.map(([, v]) => v))
        return new Promise((resolve) => gates.push(() => resolve(entries.map(([, v]) => v))))
      },
      { ...limits, maxConcurrentCommits: 2 },
      ([key]) => key,
    )
    const turn = () => new Promise<void>((resolve) => setImmediate(resolve))
    const a = gc.submit([[1, 10]], 1)
    const b = gc.submit([[2, 20]], 1) // key 2: not held by the running commit, so it starts at once
    await turn()
    t.same(started, [[10], [20]], 'a lone call of another key does not wait for the running commit')
    const c = gc.submit([[1, 11]], 1) // key 1 is held: waits
    const d = gc.submit([[3, 30]], 1) // free, but behind c: never passes it
    await turn()
    t.same(started, [[10], [20]], 'both wait: the first shares a key, the second is behind it')
    t.equal(gc.backlog, 2)
    gates[1]!() // b's commit ends: key 1 is still held by a's, so nothing starts beside it
    t.same(await b, [20])
    await turn()
    t.same(started, [[10], [20]], 'c still waits for the commit of its key')
    gates[0]!()
    t.same(await a, [10])
    await turn()
    t.same(started, [[10], [20], [11, 30]], 'with no commit running, the queue goes as one batch')
    // That commit carries two calls: the load is gathering, so a call of a free key waits for it.
    const e = gc.submit([[4, 40]], 1)
    await turn()
    t.same(started, [[10], [20], [11, 30]], 'nothing starts beside a commit of several calls')
    gates[2]!()
    t.same(await Promise.all([c, d]), [[11], [30]])
    await turn()
    t.same(started, [[10], [20], [11, 30], [40]])
    gates[3]!()
    t.same(await e, [40])
  },
)

t.test('without keyOf, commits run at once up to maxConcurrentCommits whatever they hold', async (t) => {
  const started: number[][] = []
  const gates: (() => void)[] = []
  const gc = new GroupCommitter<number, number>(
    (entries) => {
      started.push(entries)
      return new Promise((resolve) => gates.push(() => resolve(entries)))
    },
    { ...limits, maxConcurrentCommits: 2 },
  )
  const calls = [gc.submit([1], 1), gc.submit([1], 1), gc.submit([1], 1)]
  await new Promise<void>((resolve) => setImmediate(resolve))
  t.same(started, [[1], [1]])
  gates[0]!()
  gates[1]!()
  await calls[1]
  await new Promise<void>((resolve) => setImmediate(resolve))
  gates[2]!()
  t.same(await Promise.all(calls), [[1], [1], [1]])
})

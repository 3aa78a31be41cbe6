/**
 * The partition reader (src/dispatch/partition-reader.ts) against a real PostgreSQL: the reads
 * asked for in one turn go out as one statement, each partition getting its own rows in offset
 * order; groups reading one partition from one offset share the read; a partition dropped while
 * its read waited takes nothing; an empty read marks the partition caught up; holes left by
 * retention are recorded as gaps; a failed statement hands every partition back to be read again
 * in a second; more partitions than a statement takes go in several.
 */
import t from '../helpers/tap.ts'
import { PartitionReader } from '../../src/dispatch/partition-reader.ts'
import { newGroupRuntime, newPartitionState, type GroupRuntime, type PartitionState } from '../../src/dispatch/partition-state.ts'
import { GroupService } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { openDatabase, type Database } from '../../src/store/db.ts'
import { appendMessages } from '../../src/store/messages.ts'
import { findTopicByName } from '../../src/store/topics.ts'
import { SteppedClock } from '../helpers/clock.ts'
import { testDatabase } from '../helpers/db.ts'
import { appendEntry } from '../helpers/messages.ts'
import { waitUntil } from '../helpers/wait.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, database.maxConnections)
t.teardown(() => db.close())
const topics = new TopicService(db)
const groups = new GroupService(db)

await topics.put('r', 3)
const topic = (await findTopicByName(db.prisma, 'r'))!
const entry = (partition: number, value: string) => appendEntry(topic.id, partition, value)
// Partition 0: offsets 0-3 (offset 2 then deleted, as retention would); partition 1: 0-1; partition 2: empty.
await appendMessages(db, [entry(0, 'a'), entry(0, 'b'), entry(0, 'c'), entry(0, 'd'), entry(1, 'x'), entry(1, 'y')])
await db.pool.query(`DELETE FROM messages WHERE topic_id = $1 AND partition = 0 AND "offset" = 2`, [topic.id])

async function group(name: string): Promise<GroupRuntime> {
  await groups.put(name, { topic: 'r' })
  return newGroupRuntime((await groups.load(name))!.row, topic)
}
const part = (partition: number, endHint: number, committed = 0): PartitionState =>
  newPartitionState(partition, { committed, completed: new Set(), pushed: 0, seekedAtMs: 0 }, new Map(), endHint, 1)

/** A reader whose statements are counted (and can be made to fail), its onReadable calls recorded, its timers on a stepped clock. */
function reader() {
  const clock = new SteppedClock()
  const seen = { statements: 0, failNext: false, readable: [] as string[], clock }
  const counted = {
    ...db,
    pool: {
      query: (...args: unknown[]) => {
        seen.statements++
        if (seen.failNext) {
          seen.failNext = false
          return Promise.reject(new Error('connection lost'))
        }
        return (db.pool.query as (...a: unknown[]) => Promise<unknown>)(...args)
      },
    },
  } as unknown as Database
  const r = new PartitionReader({
    db: counted,
    timers: clock,
    log: { error: () => {} },
    onReadable: (g, w) => seen.readable.push(`${g.row.name}/${w.partition}`),
  })
  return { r, seen }
}

/** Waits until `n` partitions were told their buffer is readable. */
const readable = (seen: { readable: string[] }, n: number) => waitUntil(() => seen.readable.length >= n, 10_000, `${n} partitions readable`)

const ga = await group('ga')
const gb = await group('gb')

t.test('one statement for the reads of a turn; each partition its rows; shared reads; gaps', async (t) => {
  const { r, seen } = reader()
  const a0 = part(0, 4)
  const a1 = part(1, 2)
  const a2 = part(2, 0)
  const b0 = part(0, 4)
  r.read(ga, a0)
  r.read(ga, a1)
  r.read(ga, a2) // nothing known past its end: no read
  r.read(gb, b0)
  r.read(ga, a0) // already reading: not asked twice
  t.ok(a0.reading && a1.reading && b0.reading, 'marked as reading at once (produce tails wait)')
  t.notOk(a2.reading)
  await readable(seen, 3)
  t.equal(seen.statements, 1, 'one statement')
  t.same(seen.readable.sort(), ['ga/0', 'ga/1', 'gb/0'])
  t.same(
    a0.buffer.map((m) => m.offset),
    [0, 1, 3],
  )
  t.same(a0.gaps, [[2, 3]], 'the hole retention left is a gap')
  t.same(
    a1.buffer.map((m) => [m.offset, m.value]),
    [
      [0, '"x"'],
      [1, '"y"'],
    ],
  )
  t.equal(b0.buffer[0], a0.buffer[0], 'two groups at one place share the rows read')
  t.notOk(a0.reading || a1.reading || b0.reading, 'reads done')
})

/** Lets a turn of the event loop pass: the reads queued in the last one have gone out. */
const turn = () => new Promise<void>((resolve) => setImmediate(resolve))

t.test('dropped, or told of more, while the statement runs', async (t) => {
  const { r, seen } = reader()
  const a0 = part(0, 4)
  const a1 = part(1, 9, 2)
  r.read(ga, a0)
  r.read(ga, a1)
  await turn()
  t.equal(seen.statements, 1, 'the statement is out')
  a0.drop() // moved away before its rows came back
  a1.heard(12) // produce told of more while the read ran
  await waitUntil(() => !a0.reading && !a1.reading, 10_000, 'both reads done')
  t.same(seen.readable, ['ga/1'], 'only the live partition is told')
  t.same(a0.buffer, [], 'the dropped partition took nothing')
  t.equal(a1.endHint, 12, 'an empty read does not undo what produce told meanwhile')
})

t.test('more partitions than a statement takes go in several statements', async (t) => {
  await topics.put('wide', 20)
  const wide = (await findTopicByName(db.prisma, 'wide'))!
  await appendMessages(
    db,
    Array.from({ length: 20 }, (_, p) => appendEntry(wide.id, p, `m${p}`)),
  )
  await groups.put('gw', { topic: 'wide' })
  const gw = newGroupRuntime((await groups.load('gw'))!.row, wide)
  const { r, seen } = reader()
  const parts = Array.from({ length: 20 }, (_, p) => part(p, 1))
  for (const w of parts) r.read(gw, w)
  await readable(seen, 20)
  t.equal(seen.statements, 2, '16 partitions, then 4')
  t.same(
    parts.map((w) => w.buffer.map((m) => m.value)),
    Array.from({ length: 20 }, (_, p) => [JSON.stringify(`m${p}`)]),
    'each partition its own message',
  )
})

t.test('an empty read marks the partition caught up; a dropped partition takes nothing', async (t) => {
  const { r, seen } = reader()
  // Told of offsets up to 9, but the log ends at 2: the read finds nothing past the buffer.
  const a1 = part(1, 9, 2)
  const a0 = part(0, 4)
  r.read(ga, a1)
  r.read(ga, a0)
  a0.drop() // moved to another process before the statement went out
  await readable(seen, 1)
  t.same(seen.readable, ['ga/1'], 'only the live partition is told')
  t.equal(a1.endHint, 2, 'caught up: the end is where the read found nothing')
  t.same(a1.buffer, [])
  t.same(a0.buffer, [], 'the dropped partition took nothing')
  t.notOk(a0.reading, 'and is not left reading')
})

t.test('a failed statement: every live partition is read again in a second', async (t) => {
  const { r, seen } = reader()
  seen.failNext = true
  const a0 = part(0, 4)
  const a1 = part(1, 2)
  r.read(ga, a0)
  r.read(ga, a1)
  await waitUntil(() => seen.clock.pending.length >= 2, 10_000, 'both partitions re-armed')
  t.same(
    seen.clock.pending.map((x) => x.inMs),
    [1000, 1000],
  )
  t.notOk(a0.reading || a1.reading, 'free to read again')
  t.same(seen.readable, [], 'nothing readable yet')
  seen.clock.advance(1000)
  t.same(seen.readable.sort(), ['ga/0', 'ga/1'], 'told to try again')
  r.read(ga, a0)
  await readable(seen, 3)
  t.same(
    a0.buffer.map((m) => m.offset),
    [0, 1, 3],
    'the next read gets the rows',
  )
})

/**
 * src/store/consumption.ts, the dispatcher's hot SQL, statement by statement against a real
 * PostgreSQL: where a group stands on a partition (loadProgress), the read of the log
 * (readForDispatch), attempts counted after a restart (attemptCounts), the fenced progress write
 * (writeProgress) and the seek (seekOffsets). The progress writer that batches writeProgress is
 * tested in test/dispatch/progress.test.ts.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import {
  attemptCounts,
  handBack,
  loadProgress,
  readForDispatch,
  seekOffsets,
  writeProgress,
  type PartitionWrite,
  type ProgressBatch,
  STILL_DELAYED_MARGIN_MS,
} from '../../src/store/consumption.ts'
import { openDatabase } from '../../src/store/db.ts'
import { HANDED_OVER, handedOverInFlight, insertAttempts, updateAttempts } from '../../src/store/deliveries.ts'
import { newDeliveryId } from '../../src/core/delivery-id.ts'
import { claimPartition } from '../../src/store/membership.ts'
import { appendMessages, readMessages, type AppendEntry } from '../../src/store/messages.ts'
import { findTopicByName } from '../../src/store/topics.ts'
import { GroupService } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { testDatabase } from '../helpers/db.ts'
import { appendEntry } from '../helpers/messages.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, database.maxConnections)
t.teardown(() => db.close())
const topics = new TopicService(db)
const groups = new GroupService(db)

/** A group on a new topic of two partitions with offsets rows, and partition 0 claimed (its epoch). */
async function setup(name: string, opts: { dlq?: string } = {}) {
  await topics.put(name, 2)
  if (opts.dlq) await topics.put(opts.dlq, 1)
  await groups.put(name, { topic: name, ...(opts.dlq ? { deadLetterTopic: opts.dlq } : {}) })
  const row = (await groups.load(name))!.row
  const topic = (await findTopicByName(db.prisma, name))!
  await groups.ensureOffsets(row, topic.id, 2)
  const epoch = (await claimPartition(db.pool, row.id, 0))!
  const key = { groupId: row.id, topicId: topic.id, partition: 0 }
  const write = (w: Partial<PartitionWrite>, rest: Partial<Omit<ProgressBatch, 'partitions'>> = {}) =>
    writeProgress(db, {
      partitions: [{ ...key, ownerEpoch: epoch, committedOffset: null, pushedOffset: null, filtered: 0, ...w }],
      completions: [],
      deadLetters: [],
      ...rest,
    })
  const completion = (offset: number) => ({ ...key, offset })
  return { row, topic, key, epoch, write, completion }
}

/** An entry for partition 0 unless `extra` says otherwise. */
const entry = (topicId: number, value: string, extra: Partial<AppendEntry> = {}) => appendEntry(topicId, 0, value, extra)

t.test('loadProgress: null without an offsets row; a new group stands at 0 with nothing completed', async (t) => {
  const s = await setup('load')
  t.equal(await loadProgress(db.pool, s.row.id, s.topic.id, 5), null, 'no such partition')
  t.same(await loadProgress(db.pool, s.row.id, s.topic.id, 1), { committed: 0, completed: new Set(), pushed: 0, seekedAtMs: 0 })
})

t.test('writeProgress: completions above the committed offset are kept, those it passes deleted', async (t) => {
  const s = await setup('progress')
  t.same(await s.write({}, { completions: [s.completion(2), s.completion(3), s.completion(5)] }), { refused: [], deadLettered: [] })
  t.same(await loadProgress(db.pool, s.row.id, s.topic.id, 0), { committed: 0, completed: new Set([2, 3, 5]), pushed: 0, seekedAtMs: 0 })

  // Offsets 0 and 1 completed in order: the committed offset moves past 2 and 3, which go.
  await s.write({ committedOffset: 4, pushedOffset: 8 })
  const p = (await loadProgress(db.pool, s.row.id, s.topic.id, 0))!
  t.same([p.committed, [...p.completed], p.pushed], [4, [5], 8])
  t.same(
    await loadProgress(db.pool, s.row.id, s.topic.id, 1),
    { committed: 0, completed: new Set(), pushed: 0, seekedAtMs: 0 },
    'partition 1 untouched',
  )
})

t.test('writeProgress: the committed offset and the push reservation never move back; filtered adds up', async (t) => {
  const s = await setup('monotonic')
  await s.write({ committedOffset: 10, pushedOffset: 20, filtered: 3 })
  await s.write({ committedOffset: 7, pushedOffset: 12, filtered: 2 })
  const p = (await loadProgress(db.pool, s.row.id, s.topic.id, 0))!
  t.same([p.committed, p.pushed], [10, 20], 'a late, lower write changes neither')
  const { rows } = await db.pool.query('SELECT filtered FROM group_offsets WHERE group_id = $1 AND partition = 0', [s.row.id])
  t.equal(rows[0].filtered, 5)
})

t.test('writeProgress: a write with an epoch no longer held changes nothing and is reported', async (t) => {
  const s = await setup('fence')
  const newer = (await claimPartition(db.pool, s.row.id, 0))!
  t.equal(newer, s.epoch + 1, 'another owner claimed partition 0')
  const result = await s.write({ committedOffset: 3, pushedOffset: 9 }, { completions: [s.completion(5)] })
  t.same(result.refused, [s.key])
  t.same(await loadProgress(db.pool, s.row.id, s.topic.id, 0), { committed: 0, completed: new Set(), pushed: 0, seekedAtMs: 0 })

  // In one batch with a partition whose epoch is held, that one is written and only the stale one refused.
  const epoch1 = (await claimPartition(db.pool, s.row.id, 1))!
  const both = await writeProgress(db, {
    partitions: [
      { ...s.key, ownerEpoch: s.epoch, committedOffset: 3, pushedOffset: null, filtered: 0 },
      { ...s.key, partition: 1, ownerEpoch: epoch1, committedOffset: 2, pushedOffset: null, filtered: 0 },
    ],
    completions: [],
    deadLetters: [],
  })
  t.same(both.refused, [s.key])
  t.equal((await loadProgress(db.pool, s.row.id, s.topic.id, 0))!.committed, 0)
  t.equal((await loadProgress(db.pool, s.row.id, s.topic.id, 1))!.committed, 2)
})

t.test('writeProgress: dead letters land in their topic with the completion, or neither does', async (t) => {
  const s = await setup('dl', { dlq: 'dl.dlq' })
  const dlq = (await findTopicByName(db.prisma, 'dl.dlq'))!
  const deadLetter = { from: s.key, entry: entry(dlq.id, 'poison', { headers: '{"hookq-dlq-offset":"0"}' }) }
  const result = await s.write({ committedOffset: 1 }, { deadLetters: [deadLetter] })
  t.same(result, { refused: [], deadLettered: [{ topicId: dlq.id, partition: 0, offset: 0 }] })
  const stored = await readMessages(db.pool, dlq.id, 0, 0, 10)
  t.same(
    stored.map((m) => [m.offset, m.value, m.headers]),
    [[0, '"poison"', '{"hookq-dlq-offset":"0"}']],
  )

  // A refused partition's dead letters are not appended.
  await claimPartition(db.pool, s.row.id, 0)
  const refused = await s.write({ committedOffset: 2 }, { deadLetters: [deadLetter] })
  t.same(refused, { refused: [s.key], deadLettered: [] })
  t.equal((await readMessages(db.pool, dlq.id, 0, 0, 10)).length, 1, 'still one dead letter')

  // The dead-letter topic deleted meanwhile: the write fails whole (the caller retries it later).
  const s2 = await setup('dl2', { dlq: 'dl2.dlq' })
  const dlq2 = (await findTopicByName(db.prisma, 'dl2.dlq'))!
  await topics.delete('dl2.dlq')
  await t.rejects(s2.write({ committedOffset: 1 }, { deadLetters: [{ from: s2.key, entry: entry(dlq2.id, 'lost') }] }), /dead-letter topic/)
  t.equal((await loadProgress(db.pool, s2.row.id, s2.topic.id, 0))!.committed, 0, 'not completed either')
})

t.test('readForDispatch: an empty read that the end offset contradicts is read once more', async (t) => {
  // What a read planned before a chunk's attach and run after it sees: not the rows the sweep moved
  // out of the topic's default (src/store/message-chunks.ts). Played here by holding the row out of
  // messages until the first read has come back empty, then putting it back.
  const s = await setup('reread')
  await appendMessages(db, [entry(s.topic.id, 'moved')])
  await db.pool.query(`CREATE TABLE reread_aside AS SELECT * FROM messages WHERE topic_id = $1`, [s.topic.id])
  t.teardown(() => db.pool.query('DROP TABLE IF EXISTS reread_aside'))
  await db.pool.query(`DELETE FROM messages WHERE topic_id = $1`, [s.topic.id])
  let reads = 0
  let restored = false
  const q = {
    query: async (text: never, values?: unknown[]) => {
      const res = await db.pool.query(text, values)
      if (typeof text === 'string' && (text as string).includes('CROSS JOIN LATERAL')) reads++
      if (reads === 1 && !restored) {
        restored = true
        await db.pool.query(`INSERT INTO messages SELECT * FROM reread_aside`)
      }
      return res
    },
  } as unknown as Parameters<typeof readForDispatch>[0]
  const [rows] = await readForDispatch(q, [{ topicId: s.topic.id, partition: 0, fromOffset: 0 }], 10)
  t.same(
    rows!.map((m) => [m.offset, m.value]),
    [[0, '"moved"']],
    'found by the second read',
  )
  t.equal(reads, 2)
  // At the end offset, an empty read is just that: read once.
  reads = 0
  t.same((await readForDispatch(q, [{ topicId: s.topic.id, partition: 0, fromOffset: 1 }], 10))[0], [])
  t.equal(reads, 1, 'no second read')
})

t.test('readForDispatch: partitions in offset order from an offset, up to a limit, with their times, in one call', async (t) => {
  const s = await setup('read')
  const other = await setup('read2')
  const before = Date.now()
  await appendMessages(db, [
    entry(s.topic.id, 'a', { key: 'k' }),
    entry(s.topic.id, 'b'),
    entry(s.topic.id, 'other partition', { partition: 1 }),
    entry(s.topic.id, 'c', { delayMs: 60_000 }),
    entry(other.topic.id, 'other topic'),
  ])
  const one = async (partition: number, fromOffset: number, limit: number) =>
    (await readForDispatch(db.pool, [{ topicId: s.topic.id, partition, fromOffset }], limit))[0]!
  const read = await one(0, 1, 10)
  t.same(
    read.map((m) => [m.offset, m.key, m.value]),
    [
      [1, null, '"b"'],
      [2, null, '"c"'],
    ],
  )
  t.same(
    (await one(0, 0, 1)).map((m) => [m.offset, m.key]),
    [[0, 'k']],
    'limit',
  )
  const [b, c] = read as [(typeof read)[0], (typeof read)[0]]
  t.ok(b.producedAtMs >= Math.floor(before / 1000) * 1000 && b.producedAtMs <= Date.now(), 'produced now')
  t.equal(b.availableAtMs, b.producedAtMs, 'no delay: available when produced')
  t.equal(c.availableAtMs - c.producedAtMs, 60_000, 'a delay of 60 s')
  t.same(await one(0, 3, 10), [], 'past the end')
  // Several partitions (and topics) in one statement: one array per request, in request order, the limit per partition.
  const many = await readForDispatch(
    db.pool,
    [
      { topicId: s.topic.id, partition: 1, fromOffset: 0 },
      { topicId: s.topic.id, partition: 0, fromOffset: 5 },
      { topicId: s.topic.id, partition: 0, fromOffset: 0 },
      { topicId: other.topic.id, partition: 0, fromOffset: 0 },
    ],
    2,
  )
  t.same(
    many.map((rows) => rows.map((m) => [m.offset, m.value])),
    [
      [[0, '"other partition"']],
      [],
      [
        [0, '"a"'],
        [1, '"b"'],
      ],
      [[0, '"other topic"']],
    ],
    'each partition its own rows',
  )
  t.same(await readForDispatch(db.pool, [], 10), [], 'nothing asked, nothing read')
})

t.test('attemptCounts: the highest attempt per offset since the last seek; reserved offsets without a row count one', async (t) => {
  const s = await setup('attempts')
  const attempt = (offset: number, n: number, startedAt = new Date()) => ({
    id: newDeliveryId({ groupId: s.row.id, partition: 0, offset, attempt: n }),
    groupId: s.row.id,
    topicId: s.topic.id,
    partition: 0,
    offset,
    attempt: n,
    consumerId: null,
    startedAtMs: startedAt.getTime(),
    ackDeadlineMs: startedAt.getTime() + 30_000,
    outcome: 'failed' as const,
  })
  const old = new Date(Date.now() - 60_000)
  await insertAttempts(db.pool, [attempt(0, 1, old), attempt(0, 2), attempt(0, 3), attempt(1, 1), attempt(6, 2), attempt(7, 1, old)])
  // Committed 0, offsets 0-4 reserved (pushed 5), 3 completed; offset 7's only attempt is older than the seek.
  const progress = { committed: 0, completed: new Set([3]), pushed: 5, seekedAtMs: Date.now() - 30_000 }
  const counts = await attemptCounts(db.pool, s.row.id, s.topic.id, 0, progress)
  t.same(
    [...counts].sort((a, b) => a[0] - b[0]),
    [
      [0, 3],
      [1, 1],
      [2, 1],
      [4, 1],
      [6, 2],
    ],
    '0 and 1 as recorded, 2 and 4 reserved and so perhaps pushed once, 3 completed, 6 recorded, 7 before the seek',
  )
  const from1 = await attemptCounts(db.pool, s.row.id, s.topic.id, 0, { ...progress, committed: 1 })
  t.notOk(from1.has(0), 'nothing below the committed offset')
})

t.test('attemptCounts: a message the reservation passed while it is still delayed was never pushed, and counts none', async (t) => {
  const s = await setup('attempts-delayed')
  const margin = STILL_DELAYED_MARGIN_MS
  await appendMessages(db, [
    entry(s.topic.id, 'now'),
    entry(s.topic.id, 'in ten minutes', { delayMs: 600_000 }),
    entry(s.topic.id, 'within the margin', { delayMs: margin / 2 }),
    entry(s.topic.id, 'now too'),
  ])
  const reservedOnly = new Set<number>()
  const progress = { committed: 0, completed: new Set<number>(), pushed: 4, seekedAtMs: 0 }
  const counts = await attemptCounts(db.pool, s.row.id, s.topic.id, 0, progress, reservedOnly)
  t.same(
    [...counts].sort((a, b) => a[0] - b[0]),
    [
      [0, 1],
      [2, 1],
      [3, 1],
    ],
    'offset 1, still delayed past any clock skew, is not counted; offset 2, due within the margin, may have been pushed',
  )
  t.same([...reservedOnly].sort(), [0, 2, 3], 'and only the counted ones rest on the reservation')
})

t.test(
  'handBack: the reservation moves back to the first offset never pushed and unsent retries go, under the epoch held only',
  async (t) => {
    const s = await setup('handback')
    const row = (offset: number, n: number) => ({
      id: newDeliveryId({ groupId: s.row.id, partition: 0, offset, attempt: n }),
      groupId: s.row.id,
      topicId: s.topic.id,
      partition: 0,
      offset,
      attempt: n,
      consumerId: null,
      startedAtMs: Date.now(),
      ackDeadlineMs: Date.now() + 30_000,
      outcome: 'in_flight' as const,
    })
    // Offsets 0-9 reserved; 0-2 pushed once (their rows written), 1 retried (its row written, never sent).
    await s.write({ pushedOffset: 10 })
    const sent = [row(0, 1), row(1, 1), row(2, 1)]
    const unsent = row(1, 2)
    await insertAttempts(db.pool, [...sent, unsent])
    const counts = async () => {
      const pr = (await loadProgress(db.pool, s.row.id, s.topic.id, 0))!
      return { pushed: pr.pushed, counts: [...(await attemptCounts(db.pool, s.row.id, s.topic.id, 0, pr))].sort((a, b) => a[0] - b[0]) }
    }
    t.same((await counts()).counts.length, 10, 'before: every reserved offset counts as pushed')

    // A handover under an epoch no longer held changes nothing.
    await handBack(db.pool, [{ ...s.key, ownerEpoch: s.epoch - 1, unpushedFrom: 3, unsent: [unsent.id] }])
    t.equal((await counts()).pushed, 10, 'a stale epoch moves nothing back')

    await handBack(db.pool, [{ ...s.key, ownerEpoch: s.epoch, unpushedFrom: 3, unsent: [unsent.id] }])
    t.same(
      await counts(),
      {
        pushed: 3,
        counts: [
          [0, 1],
          [1, 1],
          [2, 1],
        ],
      },
      'after: the next owner counts exactly the pushes made (attempt 2 next for 0-2, attempt 1 for 3 on)',
    )

    // An attempt handed over in flight: its ack deadline is read by the next owner, until it passes.
    await updateAttempts(db.pool, [{ id: sent[0]!.id, error: HANDED_OVER }])
    const held = await handedOverInFlight(db.pool, s.row.id, 0, 0)
    t.same([...held.keys()], [0], 'only the attempt handed over in flight')
    t.ok(Math.abs(held.get(0)!.untilMs - sent[0]!.ackDeadlineMs) < 5, 'with its ack deadline')
    t.match(held.get(0)!.inFlight, { id: sent[0]!.id, attempt: sent[0]!.attempt }, 'and the attempt, for the next owner to take on')
  },
)

t.test('seekOffsets: committed and reserved offsets move (back too), completions go, the epoch moves on', async (t) => {
  const s = await setup('seek')
  await s.write({ committedOffset: 10, pushedOffset: 15 }, { completions: [s.completion(12)] })
  const at = Date.now()
  await seekOffsets(db, s.row.id, s.topic.id, new Map([[0, 4]]), at)
  const p = (await loadProgress(db.pool, s.row.id, s.topic.id, 0))!
  t.same([p.committed, p.pushed, [...p.completed]], [4, 4, []], 'replayed from 4, nothing reserved above it')
  t.equal(p.seekedAtMs, at, 'the seek time, to the millisecond')
  t.same((await s.write({ committedOffset: 11 })).refused, [s.key], 'the owner from before the seek can write nothing')
  t.equal((await loadProgress(db.pool, s.row.id, s.topic.id, 0))!.committed, 4)
  t.same(
    await loadProgress(db.pool, s.row.id, s.topic.id, 1),
    { committed: 0, completed: new Set(), pushed: 0, seekedAtMs: 0 },
    'partition 1 not named',
  )
})

t.test('seekOffsets: a partition without an offsets row gets one', async (t: Test) => {
  const s = await setup('seek-new')
  await db.pool.query('DELETE FROM group_offsets WHERE group_id = $1 AND partition = 1', [s.row.id])
  t.equal(await loadProgress(db.pool, s.row.id, s.topic.id, 1), null)
  await seekOffsets(db, s.row.id, s.topic.id, new Map([[1, 7]]), Date.now())
  t.match(await loadProgress(db.pool, s.row.id, s.topic.id, 1), { committed: 7, pushed: 7 })
})

/**
 * Storage of a group's progress on a topic: committed offsets, offsets completed above them, and
 * the reads and writes of the dispatcher's hot path (raw SQL: arrays in, one statement each).
 *
 * The reads take a Queryable (the pool, or a caller's transaction). writeProgress and seekOffsets
 * take the Database: each is a transaction of its own (the dead letters' append with the progress
 * statement; the seek's two statements), and no caller has a transaction to join them to.
 */
import { numberArray, textColumn } from './arrays.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import { inTransaction, type Database, type Queryable } from './db.ts'
import { appendRows, type AppendEntry } from './messages.ts'

/** Where a group stands on one partition. */
export interface PartitionProgress {
  committed: number
  /** Offsets completed above `committed`. */
  completed: Set<number>
  /** Every offset from here on has never been pushed (first pushes below it are reserved). */
  pushed: number
  /** When the partition was last seeked (ms since the epoch), 0 if never. */
  seekedAtMs: number
}

/** A group's partition, as the fences name it. */
export interface PartitionKey {
  groupId: number
  topicId: number
  partition: number
}

/** The owner epoch a writer holds for a partition (group_offsets.owner_epoch, see src/store/membership.ts). */
export interface Fence extends PartitionKey {
  ownerEpoch: number
}

/** One completion: acked, or dead (dead-lettered, or recorded as dead without a dead-letter topic). */
export interface Completion {
  groupId: number
  topicId: number
  partition: number
  offset: number
}

/** A partition a progress write touches: the epoch held, and where its offsets move (null: they stay). */
export interface PartitionWrite extends Fence {
  /** The new committed offset (never lower than the stored one). */
  committedOffset: number | null
  /** The new push reservation: first pushes below it may go out (see attemptCounts). */
  pushedOffset: number | null
  /** Messages completed by the group's filter in this write (added to group_offsets.filtered). */
  filtered: number
}

/** Everything one progress write changes, for many partitions at once. */
export interface ProgressBatch {
  /** Every partition written for (a reservation alone, with both offsets null, only checks the fence). */
  partitions: PartitionWrite[]
  /** Completions that stay above their partition's new committed offset (out of order). */
  completions: Completion[]
  /** Dead letters to append to dead-letter topics in the same transaction, with the partition they come from. */
  deadLetters: { from: PartitionKey; entry: AppendEntry }[]
}

/** What a progress write did: partitions refused for their epoch, and where the dead letters landed. */
export interface ProgressResult {
  refused: PartitionKey[]
  deadLettered: { topicId: number; partition: number; offset: number }[]
}

/** Committed offset and out-of-order completions of a group on one partition; null when it has no offsets row. */
export async function loadProgress(q: Queryable, groupId: number, topicId: number, partition: number): Promise<PartitionProgress | null> {
  const offsets = await q.query<{ committed_offset: number; pushed_offset: number; seeked_ms: number | null }>(
    `SELECT committed_offset, pushed_offset, (extract(epoch from seeked_at) * 1000)::float8 AS seeked_ms
     FROM group_offsets WHERE group_id = $1 AND topic_id = $2 AND partition = $3`,
    [groupId, topicId, partition],
  )
  const row = offsets.rows[0]
  if (!row) return null
  const done = await q.query<{ offset: number }>(
    'SELECT "offset" FROM group_completions WHERE group_id = $1 AND topic_id = $2 AND partition = $3',
    [groupId, topicId, partition],
  )
  return {
    committed: row.committed_offset,
    completed: new Set(done.rows.map((r) => r.offset)),
    pushed: row.pushed_offset,
    seekedAtMs: row.seeked_ms ?? 0,
  }
}

const NO_HEADERS = '{}'

/** Where a read of a partition starts. */
export interface ReadFrom {
  topicId: number
  partition: number
  fromOffset: number
}

// One topic's partitions from their offsets. The topic id is a parameter of an unnamed statement,
// so PostgreSQL plans it with the value (a custom plan): the plan names only that topic's chunks of
// messages (list partitioning on topic_id), which are all it opens and locks. A named statement, or
// one read for several topics, would come to a plan over every chunk of every topic: a few hundred
// topics' chunks exhaust the lock table (docs/performance.md, "Messages in chunks").
// A row from before trace ids were kept gets one derived from what identifies it: the same at every read.
const READ_FOR_DISPATCH = `SELECT r.i::int AS i, m."offset", m.key, m.value, m.headers,
       (extract(epoch from m.produced_at) * 1000)::float8 AS produced_ms,
       (extract(epoch from m.available_at) * 1000)::float8 AS available_ms,
       coalesce(translate(m.trace_id::text, '-', ''), md5($1::int || '/' || r.p || '/' || m."offset" || '/' || extract(epoch from m.produced_at))) AS trace_id,
       m.traceparent, m.tracestate
FROM unnest($2::int[], $3::bigint[], $4::int[]) AS r(p, f, i)
CROSS JOIN LATERAL (
  SELECT "offset", key, value, headers, produced_at, available_at, trace_id, traceparent, tracestate FROM messages
  WHERE topic_id = $1 AND partition = r.p AND "offset" >= r.f ORDER BY "offset" LIMIT $5
) m`

/**
 * Up to `limit` messages of each partition from its `fromOffset`, in offset order: one array per
 * request, in request order. One statement per topic (see READ_FOR_DISPATCH), run at once on the
 * pool: a process that another process's produce call told of appends to several of its
 * partitions reads each topic's in one round trip, not one each.
 */
export async function readForDispatch(q: Queryable, reads: readonly ReadFrom[], limit: number): Promise<DispatchMessage[][]> {
  const out: DispatchMessage[][] = reads.map(() => [])
  if (reads.length === 0) return out
  const byTopic = new Map<number, number[]>()
  reads.forEach((r, k) => {
    let ks = byTopic.get(r.topicId)
    if (!ks) byTopic.set(r.topicId, (ks = []))
    ks.push(k + 1)
  })
  const readTopic = (topicId: number, ks: number[]) =>
    q.query<{
      i: number
      offset: number
      key: string | null
      value: string
      headers: string
      produced_ms: number
      available_ms: number
      trace_id: string
      traceparent: string | null
      tracestate: string | null
    }>(READ_FOR_DISPATCH, [
      topicId,
      numberArray(ks.map((k) => reads[k - 1]!.partition)),
      numberArray(ks.map((k) => reads[k - 1]!.fromOffset)),
      numberArray(ks),
      limit,
    ])
  const take = (res: Awaited<ReturnType<typeof readTopic>>) => {
    for (const r of res.rows) {
      out[r.i - 1]!.push({
        offset: r.offset,
        key: r.key,
        value: r.value,
        // Most messages have no headers: they share one '{}' instead of each keeping the one read.
        headers: r.headers === '{}' ? NO_HEADERS : r.headers,
        producedAtMs: r.produced_ms,
        availableAtMs: r.available_ms,
        traceId: r.trace_id,
        traceparent: r.traceparent,
        tracestate: r.tracestate,
      })
    }
  }
  for (const res of await Promise.all([...byTopic].map(([topicId, ks]) => readTopic(topicId, ks)))) take(res)
  // An empty read is taken for "caught up" (partition-log.ts). One that the partition's end offset
  // contradicts is read once more: the retention sweep may have moved the rows it wanted from a
  // default partition into a chunk attached just then, and a read planned before the attach but run
  // after it looks in the default alone (src/store/message-chunks.ts). Planned again, it sees the
  // chunk. Rarely more than a lookup: an empty read usually means nothing was produced.
  const empty = reads.flatMap((_read, k) => (out[k]!.length === 0 ? [k + 1] : []))
  if (empty.length > 0) {
    const ends = await q.query<{ i: number }>(
      `SELECT r.i::int AS i FROM unnest($1::int[], $2::int[], $3::bigint[], $4::int[]) AS r(t, p, f, i)
       JOIN topic_partitions tp ON tp.topic_id = r.t AND tp.partition = r.p WHERE tp.next_offset > r.f`,
      [
        numberArray(empty.map((k) => reads[k - 1]!.topicId)),
        numberArray(empty.map((k) => reads[k - 1]!.partition)),
        numberArray(empty.map((k) => reads[k - 1]!.fromOffset)),
        numberArray(empty),
      ],
    )
    const again = new Map<number, number[]>()
    for (const { i } of ends.rows) {
      const topicId = reads[i - 1]!.topicId
      let ks = again.get(topicId)
      if (!ks) again.set(topicId, (ks = []))
      ks.push(i)
    }
    for (const res of await Promise.all([...again].map(([topicId, ks]) => readTopic(topicId, ks)))) take(res)
  }
  // Each partition's rows come in offset order from its index scan; the statement does not promise
  // that order across the join, so check it (cheap) rather than trust it.
  for (const rows of out) {
    for (let k = 1; k < rows.length; k++) {
      if (rows[k]!.offset < rows[k - 1]!.offset) {
        rows.sort((a, b) => a.offset - b.offset)
        break
      }
    }
  }
  return out
}

/**
 * Attempts made per offset at or above `fromOffset` (after a restart or a takeover), counting only
 * those since the partition's last seek. An offset below `pushed` with no attempt row may have been
 * pushed once by a process that died before writing the row: it counts as one attempt, so the next
 * push is attempt 2, never a second attempt 1. (Rows of retries are written before their push, so a
 * recorded maximum is exact.)
 */
export async function attemptCounts(
  q: Queryable,
  groupId: number,
  topicId: number,
  partition: number,
  progress: PartitionProgress,
  /** Filled with the offsets counted by the reservation alone (no row): their count lasts only while the reservation covers them. */
  reservedOnly?: Set<number>,
): Promise<Map<number, number>> {
  const res = await q.query<{ offset: number; attempts: number }>(
    `SELECT "offset", max(attempt) AS attempts FROM deliveries
     WHERE group_id = $1 AND topic_id = $2 AND partition = $3 AND "offset" >= $4 AND started_at >= to_timestamp($5 / 1000.0)
     GROUP BY "offset"`,
    [groupId, topicId, partition, progress.committed, progress.seekedAtMs],
  )
  const counts = new Map(res.rows.map((r) => [r.offset, r.attempts]))
  const byReservation: number[] = []
  for (let o = progress.committed; o < progress.pushed; o++) {
    if (!counts.has(o) && !progress.completed.has(o)) {
      counts.set(o, 1)
      byReservation.push(o)
    }
  }
  if (byReservation.length > 0) {
    // A reservation of later messages may have passed a delayed one, which no push can have reached
    // while its delay runs: one still delayed now, by more than any clock skew between a broker and
    // its database could hide, was never pushed and counts none. (One waiting behind its key, or
    // whose delay has ended since, cannot be told apart: docs/performance.md.)
    const delayed = await q.query<{ offset: number }>(
      `SELECT "offset" FROM messages
       WHERE topic_id = $1 AND partition = $2 AND "offset" >= $3 AND "offset" < $4
         AND available_at > now() + make_interval(secs => $5)`,
      [topicId, partition, byReservation[0], progress.pushed, STILL_DELAYED_MARGIN_MS / 1000],
    )
    const neverPushed = new Set(delayed.rows.map((r) => Number(r.offset)))
    for (const o of byReservation) {
      if (neverPushed.has(o)) counts.delete(o)
      else reservedOnly?.add(o)
    }
  }
  return counts
}

/**
 * How much longer than now a message's delay must run for a takeover to know it was never pushed:
 * a broker pushes by its own clock, the delay ends by its database's (produced_at).
 */
export const STILL_DELAYED_MARGIN_MS = 60_000

/**
 * Writes the progress of many partitions in one statement (one round trip, one commit): for each
 * partition whose owner epoch the writer still holds, its out-of-order completions, its committed
 * offset and its push reservation, and the completions the new committed offset passed deleted;
 * with dead letters, those are appended to their topics in the same transaction, so a dead letter
 * is both in its dead-letter topic and completed, or neither. Partitions whose epoch moved on get
 * nothing written and come back in `refused`.
 *
 * The rows of group_offsets are locked in key order (`held`): a claim or a seek of one of them
 * waits for this write, and two writers can never lock the same rows in opposite orders. Takes the
 * Database: with dead letters it opens a transaction of its own (inTransaction).
 */
export async function writeProgress(db: Database, batch: ProgressBatch): Promise<ProgressResult> {
  if (batch.partitions.length === 0) return { refused: [], deadLettered: [] }
  if (batch.deadLetters.length === 0) {
    const res = await db.pool.query<{ group_id: number; topic_id: number; partition: number }>({
      name: 'hookq_progress',
      text: PROGRESS,
      values: progressParams(batch),
    })
    return { refused: refusedOf(batch.partitions, res.rows), deadLettered: [] }
  }
  return inTransaction(db, async (client) => {
    const held = await client.query<{ group_id: number; topic_id: number; partition: number }>(
      `${HELD} SELECT group_id, topic_id, partition FROM held`,
      progressParams({ ...batch, completions: [] }).slice(0, 7),
    )
    const refused = refusedOf(batch.partitions, held.rows)
    const ok = (k: PartitionKey) => !refused.some((r) => sameKey(r, k))
    const deadLetters = batch.deadLetters.filter((d) => ok(d.from)).map((d) => d.entry)
    const rows = await appendRows(client, deadLetters)
    if (rows.length !== deadLetters.length) throw new Error('a dead-letter topic was deleted; the dead letters will be retried')
    await client.query({ name: 'hookq_progress', text: PROGRESS, values: progressParams(batch) })
    return {
      refused,
      deadLettered: rows.map((r) => ({ topicId: deadLetters[r.ord - 1]!.topicId, partition: r.partition, offset: r.offset })),
    }
  })
}

function progressParams(batch: ProgressBatch): unknown[] {
  const p = batch.partitions
  const c = batch.completions
  return [
    numberArray(p.map((r) => r.groupId)),
    numberArray(p.map((r) => r.topicId)),
    numberArray(p.map((r) => r.partition)),
    numberArray(p.map((r) => r.ownerEpoch)),
    numberArray(p.map((r) => r.committedOffset)),
    numberArray(p.map((r) => r.pushedOffset)),
    numberArray(p.map((r) => r.filtered)),
    numberArray(c.map((r) => r.groupId)),
    numberArray(c.map((r) => r.topicId)),
    numberArray(c.map((r) => r.partition)),
    numberArray(c.map((r) => r.offset)),
  ]
}

/**
 * The fence: the offsets rows whose epoch the writer still holds, locked (in key order) until it
 * commits. A new owner's claim (or a seek) bumps the epoch with an UPDATE of the same row, so it
 * waits for this write to commit, and this write, if it comes second, finds the new epoch and
 * writes nothing.
 */
const HELD = `
WITH held AS MATERIALIZED (
  SELECT o.group_id, o.topic_id, o.partition, u.c, u.r, u.f FROM group_offsets o
  JOIN unnest($1::int[], $2::int[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[]) AS u(g, t, p, e, c, r, f)
    ON o.group_id = u.g AND o.topic_id = u.t AND o.partition = u.p AND o.owner_epoch = u.e
  ORDER BY o.group_id, o.topic_id, o.partition
  FOR NO KEY UPDATE OF o
)`

// The rows it inserts (offsets at or above the new committed offset) and those it deletes (below
// it) are disjoint, so it does not matter that the sub-statements share one snapshot.
const PROGRESS = `${HELD}, done AS (
  INSERT INTO group_completions (group_id, topic_id, partition, "offset")
  SELECT x.g, x.t, x.p, x.x FROM unnest($8::int[], $9::int[], $10::int[], $11::bigint[]) AS x(g, t, p, x)
  JOIN held h ON h.group_id = x.g AND h.topic_id = x.t AND h.partition = x.p
  ON CONFLICT DO NOTHING
), moved AS (
  UPDATE group_offsets o SET committed_offset = GREATEST(o.committed_offset, coalesce(h.c, 0)),
                             pushed_offset = GREATEST(o.pushed_offset, coalesce(h.r, 0)),
                             filtered = o.filtered + h.f
  FROM held h
  WHERE o.group_id = h.group_id AND o.topic_id = h.topic_id AND o.partition = h.partition AND (h.c IS NOT NULL OR h.r IS NOT NULL OR h.f > 0)
), passed AS (
  DELETE FROM group_completions gc USING held h
  WHERE h.c IS NOT NULL AND gc.group_id = h.group_id AND gc.topic_id = h.topic_id AND gc.partition = h.partition AND gc."offset" < h.c
)
SELECT group_id, topic_id, partition FROM held`

/** The partitions asked about that are not among those the database let through. */
function refusedOf(asked: PartitionKey[], held: { group_id: number; topic_id: number; partition: number }[]): PartitionKey[] {
  const ok = new Set(held.map((h) => `${h.group_id}:${h.topic_id}:${h.partition}`))
  const refused = new Map<string, PartitionKey>()
  for (const a of asked) {
    const k = `${a.groupId}:${a.topicId}:${a.partition}`
    if (!ok.has(k)) refused.set(k, { groupId: a.groupId, topicId: a.topicId, partition: a.partition })
  }
  return [...refused.values()]
}

const sameKey = (a: PartitionKey, b: PartitionKey) => a.groupId === b.groupId && a.topicId === b.topicId && a.partition === b.partition

/** What a process handing a partition over says it never pushed (see handBack). */
export interface HandBack extends Fence {
  /** No first push of an offset from here on was made under this epoch (nor counted from before it): the reservation moves back here. */
  unpushedFrom: number
  /** Retries whose attempt row was written but whose push never went out: their rows go. */
  unsent: string[]
}

/**
 * A graceful handover's last write, once the attempt rows of every push made under the epoch are
 * written: the push reservation moves back to the first offset reserved but never pushed, and the
 * rows of retries recorded but never sent are deleted. The next owner then counts exactly the
 * pushes made (rows), not pushes that may have been made (the reservation), so it pushes attempt
 * n + 1 after attempt n, with no number skipped. Fenced like every progress write: a partition
 * whose epoch moved on is left as it is (its reservation then only over-counts, never under-counts).
 */
export async function handBack(q: Queryable, parts: HandBack[]): Promise<void> {
  if (parts.length === 0) return
  const unsent = parts.flatMap((p) => p.unsent.map((id) => ({ id, key: parseDeliveryId(id) })).filter((x) => x.key !== null))
  await q.query(
    `WITH held AS MATERIALIZED (
       SELECT o.group_id, o.topic_id, o.partition, u.r FROM group_offsets o
       JOIN unnest($1::int[], $2::int[], $3::int[], $4::bigint[], $5::bigint[]) AS u(g, t, p, e, r)
         ON o.group_id = u.g AND o.topic_id = u.t AND o.partition = u.p AND o.owner_epoch = u.e
       ORDER BY o.group_id, o.topic_id, o.partition
       FOR NO KEY UPDATE OF o
     ), lowered AS (
       UPDATE group_offsets o SET pushed_offset = GREATEST(o.committed_offset, LEAST(o.pushed_offset, h.r))
       FROM held h WHERE o.group_id = h.group_id AND o.topic_id = h.topic_id AND o.partition = h.partition
     )
     DELETE FROM deliveries d USING held h, unnest($6::int[], $7::int[], $8::bigint[], $9::int[], $10::text[]) AS x(g, p, o, a, id)
     WHERE h.group_id = x.g AND h.partition = x.p
       AND d.group_id = x.g AND d.partition = x.p AND d."offset" = x.o AND d.attempt = x.a AND d.id = x.id`,
    [
      numberArray(parts.map((p) => p.groupId)),
      numberArray(parts.map((p) => p.topicId)),
      numberArray(parts.map((p) => p.partition)),
      numberArray(parts.map((p) => p.ownerEpoch)),
      numberArray(parts.map((p) => p.unpushedFrom)),
      numberArray(unsent.map((x) => x.key!.groupId)),
      numberArray(unsent.map((x) => x.key!.partition)),
      numberArray(unsent.map((x) => x.key!.offset)),
      numberArray(unsent.map((x) => x.key!.attempt)),
      textColumn(unsent, (x) => x.id),
    ],
  )
}

/**
 * Moves a group's committed offsets (seek) and forgets its completions on those partitions. The
 * replayed messages start again at attempt 1: the push reservation moves back with the offset, and
 * the seek time hides earlier attempts from a restart's count. The owner epoch moves on too, so the
 * partition's owner (any process) can write nothing more from before the seek; it claims the
 * partition again and reloads it. Its two statements are a transaction of its own (inTransaction).
 */
export async function seekOffsets(
  db: Database,
  groupId: number,
  topicId: number,
  offsets: Map<number, number>,
  seekedAtMs: number,
): Promise<void> {
  const partitions = [...offsets.keys()]
  const values = partitions.map((p) => offsets.get(p)!)
  await inTransaction(db, async (client) => {
    await client.query(
      `INSERT INTO group_offsets (group_id, topic_id, partition, committed_offset, pushed_offset, seeked_at)
       SELECT $1, $2, p, c, c, to_timestamp($5 / 1000.0) FROM unnest($3::int[], $4::bigint[]) AS u(p, c)
       ON CONFLICT (group_id, topic_id, partition) DO UPDATE
       SET committed_offset = EXCLUDED.committed_offset, pushed_offset = EXCLUDED.pushed_offset, seeked_at = EXCLUDED.seeked_at,
         owner_epoch = group_offsets.owner_epoch + 1`,
      [groupId, topicId, partitions, values, seekedAtMs],
    )
    await client.query('DELETE FROM group_completions WHERE group_id = $1 AND topic_id = $2 AND partition = ANY($3::int[])', [
      groupId,
      topicId,
      partitions,
    ])
  })
}

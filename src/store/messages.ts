/**
 * Storage of messages: the append transaction behind group commit, and reads in offset order.
 *
 * Append is raw SQL: it is the hot path, and what it needs — locking the partition rows in a fixed
 * order and inserting thousands of rows from arrays, in one statement — is beyond Prisma's query
 * API. Reads go through Prisma; a page of messages is raw SQL too, bounded by bytes with a window.
 */
import { numberArray } from './arrays.ts'
import type { Database, Queryable } from './db.ts'
import { CommitOutcomeUnknown, isAnswerLost } from '../core/database-errors.ts'

/**
 * One message to append; `value` and `headers` are JSON text. The trace fields are the message's
 * W3C trace context (src/core/trace-context.ts): a trace id always, the producer's
 * traceparent and tracestate when it gave them.
 */
export interface AppendEntry {
  topicId: number
  partition: number
  key: string | null
  value: string
  headers: string
  delayMs: number
  idempotencyKey: string | null
  traceId: string
  traceparent: string | null
  tracestate: string | null
}

/** Where an appended message landed; `duplicate` when its idempotency key was seen before. */
export interface Coordinates {
  partition: number
  offset: number
  duplicate: boolean
  /** The stored produce time, ms since the epoch (fresh appends only, not duplicates). */
  producedAtMs?: number
}

/** A row the APPEND statement returns: the entry's 1-based position, where it landed, and when. */
export interface AppendedRow {
  ord: number
  partition: number
  offset: number
  at_ms: number
}

export interface StoredMessage {
  partition: number
  offset: number
  key: string | null
  value: string
  headers: string
  timestamp: Date
}

// The whole append is this one statement, committed on its own: it locks the partition rows in
// (topic, partition) order (so concurrent appends never deadlock), hands out one dense range of
// offsets per partition, and inserts the messages. One round trip, so the partition locks are held
// only for the statement and its commit; they are held until COMMIT, so a partition's appends
// commit in offset order and no reader ever sees offset n+1 before n.
// Values and headers arrive as one JSON array each and are split by json_array_elements, whose
// elements keep their exact input text: no per-value array escaping on the way in. Trace ids come
// as a uuid[] literal of bare hex; traceparents and tracestates as JSON arrays, or NULL when no
// entry has one (the common case: ROWS FROM pads the missing column with NULLs).
// clock_timestamp() is read after the locks are taken, so timestamps never go backwards along a
// partition's offsets (now() would be the statement start, before waiting for the lock).
const APPEND = `
WITH input AS (
  SELECT * FROM ROWS FROM (
    unnest($1::int[]), unnest($2::int[]), json_array_elements_text($3::json),
    json_array_elements($4::json), json_array_elements($5::json), unnest($6::int[]),
    json_array_elements_text($7::json), unnest($8::uuid[]), json_array_elements_text($9::json),
    json_array_elements_text($10::json)
  ) WITH ORDINALITY AS u(topic_id, partition, key, value, headers, delay_ms, idempotency_key, trace_id,
                         traceparent, tracestate, ord)
), counts AS (
  SELECT topic_id, partition, count(*) AS n FROM input GROUP BY topic_id, partition
), locked AS (
  SELECT p.topic_id, p.partition FROM topic_partitions p
  JOIN counts c ON c.topic_id = p.topic_id AND c.partition = p.partition
  ORDER BY p.topic_id, p.partition
  FOR UPDATE OF p
), allocated AS (
  UPDATE topic_partitions p SET next_offset = p.next_offset + c.n
  FROM locked l JOIN counts c ON c.topic_id = l.topic_id AND c.partition = l.partition
  WHERE p.topic_id = l.topic_id AND p.partition = l.partition
  RETURNING p.topic_id, p.partition, p.next_offset - c.n AS first_offset
), numbered AS (
  SELECT i.*, a.first_offset + row_number() OVER (PARTITION BY i.topic_id, i.partition ORDER BY i.ord) - 1 AS "offset"
  FROM input i JOIN allocated a ON a.topic_id = i.topic_id AND a.partition = i.partition
), stamped AS (
  -- count(*) drains "allocated", so every partition lock is held before the clock is read
  SELECT clock_timestamp() AS at FROM (SELECT count(*) AS n FROM allocated) a WHERE a.n > 0
), inserted AS (
  INSERT INTO messages (topic_id, partition, "offset", key, value, headers, produced_at, available_at,
                        trace_id, traceparent, tracestate)
  SELECT n.topic_id, n.partition, n."offset", n.key, n.value::text, n.headers::text, s.at,
         s.at + n.delay_ms * interval '1 millisecond', n.trace_id, n.traceparent, n.tracestate
  FROM numbered n CROSS JOIN stamped s
), keyed AS (
  -- a key stored meanwhile by another writer fails this on the primary key: the caller retries
  INSERT INTO idempotency_keys (topic_id, key, partition, "offset", produced_at)
  SELECT n.topic_id, n.idempotency_key, n.partition, n."offset", s.at
  FROM numbered n CROSS JOIN stamped s WHERE n.idempotency_key IS NOT NULL
)
`

// One row per partition, not per message (appendRows numbers the entries from first_offset in
// input order, as "numbered" did): parsing a row per message was 5% of the broker's produce.
// at_ms: the stored produce time (timestamptz(3) keeps milliseconds), for the dispatcher's tail.
const AT_MS = '(extract(epoch from (SELECT at FROM stamped)::timestamptz(3)) * 1000)::float8 AS at_ms'
const APPEND_ONLY = `${APPEND}
SELECT topic_id, partition, first_offset, ${AT_MS} FROM allocated`

// The append that also reserves first pushes (AppendReservation): for each one asked, the group's
// pushed_offset moves from the partition's old end to past the first `n` messages appended, in the
// same commit as the messages. Fenced as every progress write is (the owner epoch), and only where
// every earlier offset was reserved already (pushed_offset = the old end): anything else is left to
// the progress writer. A row locked by another write (a completion committing) is skipped, its
// messages reserved by the progress writer as before: waiting for it made the produce call wait for
// that commit (its p99 1.8x at 500 calls a second), and a statement that waits on an offsets row
// while holding partition rows could deadlock with one that takes them the other way round (a
// dead letter's write).
const APPEND_RESERVING = `${APPEND}, asked AS (
  SELECT * FROM unnest($11::int[], $12::int[], $13::int[], $14::bigint[], $15::int[]) AS r(group_id, topic_id, partition, epoch, n)
), fenced AS (
  SELECT o.group_id, o.topic_id, o.partition, a.first_offset + r.n AS pushed
  FROM asked r
  JOIN allocated a ON a.topic_id = r.topic_id AND a.partition = r.partition
  JOIN group_offsets o ON o.group_id = r.group_id AND o.topic_id = r.topic_id AND o.partition = r.partition
  WHERE o.owner_epoch = r.epoch AND o.pushed_offset = a.first_offset
  ORDER BY o.group_id, o.topic_id, o.partition
  FOR NO KEY UPDATE OF o SKIP LOCKED
), reserved AS (
  UPDATE group_offsets o SET pushed_offset = f.pushed FROM fenced f
  WHERE o.group_id = f.group_id AND o.topic_id = f.topic_id AND o.partition = f.partition
  RETURNING o.group_id, o.topic_id, o.partition
)
SELECT a.topic_id, a.partition, a.first_offset, ${AT_MS},
       ARRAY(SELECT r.group_id FROM reserved r WHERE r.topic_id = a.topic_id AND r.partition = a.partition) AS reserved
FROM allocated a`

const FIND_IDEMPOTENCY_KEYS = `
SELECT i.topic_id, i.key AS idempotency_key, i.partition, i."offset",
       i.produced_at < clock_timestamp() - t.retention_ms * interval '1 millisecond' AS expired
FROM unnest($1::int[], $2::text[]) AS k(topic_id, key)
JOIN idempotency_keys i ON i.topic_id = k.topic_id AND i.key = k.key
JOIN topics t ON t.id = i.topic_id`

// A key whose message outlived the topic's retention no longer deduplicates; free it for reuse
// (the sweep would delete it soon; a produce that reuses it cannot wait for that). Only if still
// expired: a concurrent writer may have freed and stored it anew in between.
const RELEASE_IDEMPOTENCY_KEYS = `
DELETE FROM idempotency_keys i USING unnest($1::int[], $2::text[]) AS k(topic_id, key), topics t
WHERE i.topic_id = k.topic_id AND i.key = k.key AND t.id = i.topic_id
  AND i.produced_at < clock_timestamp() - t.retention_ms * interval '1 millisecond'`

/** Postgres errors after which re-running the whole append is correct and likely to succeed. */
const RETRYABLE = new Set([
  '23505', // unique_violation: a concurrent writer stored the same idempotency key first
  '40P01', // deadlock_detected
  '40001', // serialization_failure
  // check_violation: the only check on messages is a partition's bound, and a row breaks it only when
  // the insert was routed to a topic's default partition and then waited for its lock while the
  // sweep attached the chunk that now holds that span (src/store/message-chunks.ts); run again, it
  // is routed to the chunk.
  '23514',
])
const MAX_ATTEMPTS = 4

/**
 * Runs an append (a whole transaction of it) again after an error that says another writer got in
 * the way; such a run wrote nothing, so running it again is correct. HTTP produce and the outbox's
 * moves share it.
 */
export async function withAppendRetries<T>(run: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run()
    } catch (err) {
      const code = (err as { code?: string }).code
      if (attempt >= MAX_ATTEMPTS || code === undefined || !RETRYABLE.has(code)) throw err
    }
  }
}

const idKey = (topicId: number, key: string) => `${topicId}\u0000${key}`

/**
 * A topic's partition as one number, so the produce path makes no string per entry: exact for any
 * int4 topic id and partitions below 2^21 (the API allows 1024).
 */
export const partitionKey = (topicId: number, partition: number) => topicId * 2 ** 21 + partition

/**
 * Runs the APPEND statement for entries (idempotency already settled by the caller): alone it is
 * its own transaction; on a transaction's client it joins that transaction. Returns, for each
 * appended entry, its 1-based position in `entries` with its partition and offset.
 */
export async function appendRows(q: Queryable, entries: AppendEntry[]): Promise<AppendedRow[]> {
  return (await append(q, entries, [])).rows
}

/**
 * First pushes of a group on a partition that an append may reserve in its own statement: the
 * `count` first messages it appends there (group_offsets.pushed_offset, src/store/consumption.ts).
 */
export interface AppendReservation {
  groupId: number
  topicId: number
  partition: number
  /** The owner epoch the dispatcher holds: the reservation is fenced by it. */
  ownerEpoch: number
  count: number
}

/** Who decides which first pushes an append reserves (the dispatcher: src/dispatch/reservations.ts appendRoom). */
export interface AppendReserver<R extends AppendReservation> {
  /** Just before the append of `entries`: the reservations its statement should write. */
  reservationsFor(entries: readonly AppendEntry[]): R[]
  /**
   * After it, once for each reservationsFor: where each reservation now ends (pushed_offset), or
   * null where it was not written (fenced, or the append failed or may not have committed).
   */
  reservationsDone(reservations: R[], reservedTo: readonly (number | null)[]): void
}

/** Runs the APPEND statement (reserving too, when asked): the rows, and each reservation's new end or null. */
async function append(
  q: Queryable,
  entries: AppendEntry[],
  reservations: readonly AppendReservation[],
): Promise<{ rows: AppendedRow[]; reservedTo: (number | null)[] }> {
  const reserving = reservations.length > 0
  const res = await q.query<{ topic_id: number; partition: number; first_offset: number; at_ms: number; reserved?: number[] }>(
    reserving ? { name: 'hookq_append_reserving', text: APPEND_RESERVING } : { name: 'hookq_append', text: APPEND_ONLY },
    [
      numberArray(entries.map((e) => e.topicId)),
      numberArray(entries.map((e) => e.partition)),
      JSON.stringify(entries.map((e) => e.key)),
      `[${entries.map((e) => e.value).join(',')}]`,
      `[${entries.map((e) => e.headers).join(',')}]`,
      numberArray(entries.map((e) => e.delayMs)),
      JSON.stringify(entries.map((e) => e.idempotencyKey)),
      `{${entries.map((e) => e.traceId).join(',')}}`,
      entries.some((e) => e.traceparent !== null) ? JSON.stringify(entries.map((e) => e.traceparent)) : null,
      entries.some((e) => e.tracestate !== null) ? JSON.stringify(entries.map((e) => e.tracestate)) : null,
      ...(reserving
        ? [
            numberArray(reservations.map((r) => r.groupId)),
            numberArray(reservations.map((r) => r.topicId)),
            numberArray(reservations.map((r) => r.partition)),
            numberArray(reservations.map((r) => r.ownerEpoch)),
            numberArray(reservations.map((r) => r.count)),
          ]
        : []),
    ],
  )
  // The next offset of each partition written, numbered in input order from its first; a partition
  // not returned (its topic was deleted meanwhile) got nothing, and its entries no row.
  const next = new Map<number, number>()
  for (const r of res.rows) next.set(partitionKey(r.topic_id, r.partition), r.first_offset)
  const atMs = res.rows[0]?.at_ms ?? 0
  const rows: AppendedRow[] = []
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!
    const key = partitionKey(e.topicId, e.partition)
    const offset = next.get(key)
    if (offset === undefined) continue
    next.set(key, offset + 1)
    rows.push({ ord: i + 1, partition: e.partition, offset, at_ms: atMs })
  }
  const reservedTo = reservations.map((r) => {
    const row = res.rows.find((x) => x.topic_id === r.topicId && x.partition === r.partition)
    return row?.reserved?.includes(r.groupId) ? row.first_offset + r.count : null
  })
  return { rows, reservedTo }
}

/**
 * Appends the entries atomically (all or nothing) and returns each one's coordinates in input
 * order; null for an entry whose topic no longer exists. Resolves only after the commit. Runs on a
 * client of its own (see appendChecked), retried after a conflict, hence the Database; a caller's
 * transaction appends with appendDeduplicated and appendRows on its client instead (see outbox.ts).
 */
export async function appendMessages<R extends AppendReservation>(
  db: Database,
  entries: AppendEntry[],
  reserver?: AppendReserver<R>,
): Promise<(Coordinates | null)[]> {
  return withAppendRetries(() =>
    appendDeduplicated(
      entries,
      (all) => findKnownKeys(db.pool, all),
      (fresh) => appendChecked(db, fresh, reserver),
    ),
  )
}

// A page of a partition: at most $4 messages and $5 bytes of values, headers and keys, but always
// the first however large (octet_length reads a stored text's size without fetching it), so a
// reader gets through 256 MiB messages one at a time instead of failing on a page it cannot hold.
const READ_PAGE = `
SELECT partition, "offset", key, value, headers, produced_at FROM (
  SELECT m.*, row_number() OVER w AS n,
         sum(octet_length(m.value) + octet_length(m.headers) + coalesce(octet_length(m.key), 0)) OVER w AS upto
  FROM (SELECT partition, "offset", key, value, headers, produced_at FROM messages
        WHERE topic_id = $1 AND partition = $2 AND "offset" >= $3 ORDER BY "offset" LIMIT $4) m
  WINDOW w AS (ORDER BY m."offset" ROWS UNBOUNDED PRECEDING)
) s
WHERE n = 1 OR upto <= $5
ORDER BY "offset"`

/**
 * Up to `limit` messages of a partition from `fromOffset` on, in offset order, and no more than
 * `maxBytes` of them past the first (values, headers and keys).
 */
export async function readMessages(
  q: Queryable,
  topicId: number,
  partition: number,
  fromOffset: number,
  limit: number,
  maxBytes = Number.MAX_SAFE_INTEGER,
): Promise<StoredMessage[]> {
  // An unnamed statement, not Prisma's prepared ones: planned with the topic id's value, so only
  // that topic's chunks are planned, opened and locked (a generic plan would lock every topic's).
  const { rows } = await q.query<{
    partition: number
    offset: number
    key: string | null
    value: string
    headers: string
    produced_at: Date
  }>(READ_PAGE, [topicId, partition, fromOffset, limit, Math.min(maxBytes, Number.MAX_SAFE_INTEGER)])
  return rows.map((r) => ({
    partition: r.partition,
    offset: Number(r.offset),
    key: r.key,
    value: r.value,
    headers: r.headers,
    timestamp: r.produced_at,
  }))
}

/**
 * The append on a client of its own, so the two ways it can fail are told apart: failing to get
 * a connection means nothing was sent (safe to retry); losing the connection after sending the
 * statement means it may have committed (CommitOutcomeUnknown).
 */
async function appendChecked<R extends AppendReservation>(
  db: Database,
  entries: AppendEntry[],
  reserver: AppendReserver<R> | undefined,
): Promise<AppendedRow[]> {
  const client = await db.pool.connect()
  let broken = false
  let reservations: R[] = []
  let reservedTo: (number | null)[] = []
  try {
    // Asked once the connection is had: the reservations hold their partitions' room until done.
    reservations = reserver?.reservationsFor(entries) ?? []
    reservedTo = reservations.map(() => null)
    const result = await append(client, entries, reservations)
    reservedTo = result.reservedTo
    return result.rows
  } catch (err) {
    if (isAnswerLost(err)) {
      broken = true
      throw new CommitOutcomeUnknown(err)
    }
    throw err
  } finally {
    client.release(broken)
    // Before the caller hears of the append (and hands its messages to the dispatcher).
    if (reservations.length > 0) reserver!.reservationsDone(reservations, reservedTo)
  }
}

/**
 * Appends entries, settling idempotency keys first: an entry whose key is stored (within
 * retention) gets the stored coordinates as a duplicate, a repeat within `entries` those of its
 * first, and only the rest are appended. `find` looks keys up and `append` runs the APPEND: on
 * the pool for HTTP produce, on one transaction's client for the outbox (src/store/outbox.ts).
 */
export async function appendDeduplicated(
  entries: AppendEntry[],
  find: (entries: AppendEntry[]) => Promise<Map<string, Omit<Coordinates, 'duplicate'>>>,
  append: (fresh: AppendEntry[]) => Promise<AppendedRow[]>,
): Promise<(Coordinates | null)[]> {
  const result: (Coordinates | null)[] = new Array(entries.length).fill(null)
  // Idempotency keys are looked up before the append, without locks. A concurrent writer that
  // stores the same key in between makes the append fail on idempotency_keys' primary key; the retry then
  // finds the key here.
  const known = entries.some((e) => e.idempotencyKey !== null) ? await find(entries) : new Map<string, Omit<Coordinates, 'duplicate'>>()
  const duplicateOf = new Map<number, number>() // a repeat within this batch → the first
  const firstWithKey = new Map<string, number>()
  const fresh: AppendEntry[] = []
  const freshIndex: number[] = []
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!
    if (e.idempotencyKey !== null) {
      const k = idKey(e.topicId, e.idempotencyKey)
      const stored = known.get(k)
      if (stored) {
        result[i] = { ...stored, duplicate: true }
        continue
      }
      const first = firstWithKey.get(k)
      if (first !== undefined) {
        duplicateOf.set(i, first)
        continue
      }
      firstWithKey.set(k, i)
    }
    fresh.push(e)
    freshIndex.push(i)
  }
  if (fresh.length > 0) {
    // Rows come back only for partitions that still exist; a deleted topic's entries stay null.
    for (const row of await append(fresh)) {
      result[freshIndex[row.ord - 1]!] = { partition: row.partition, offset: row.offset, duplicate: false, producedAtMs: row.at_ms }
    }
  }
  for (const [i, first] of duplicateOf) {
    const original = result[first]
    result[i] = original ? { ...original, duplicate: true } : null
  }
  return result
}

/** Idempotency keys of these entries already stored within retention, with their coordinates; frees the expired ones. */
export async function findKnownKeys(
  q: Queryable,
  entries: Pick<AppendEntry, 'topicId' | 'idempotencyKey'>[],
): Promise<Map<string, Omit<Coordinates, 'duplicate'>>> {
  const known = new Map<string, Omit<Coordinates, 'duplicate'>>()
  const topicIds: number[] = []
  const keys: string[] = []
  for (const e of entries) {
    if (e.idempotencyKey !== null) {
      topicIds.push(e.topicId)
      keys.push(e.idempotencyKey)
    }
  }
  if (keys.length === 0) return known
  const found = await q.query<{ topic_id: number; idempotency_key: string; partition: number; offset: number; expired: boolean }>(
    FIND_IDEMPOTENCY_KEYS,
    [topicIds, keys],
  )
  const expired = found.rows.filter((r) => r.expired)
  if (expired.length > 0) {
    await q.query(RELEASE_IDEMPOTENCY_KEYS, [expired.map((r) => r.topic_id), expired.map((r) => r.idempotency_key)])
  }
  for (const r of found.rows) {
    if (!r.expired) known.set(idKey(r.topic_id, r.idempotency_key), { partition: r.partition, offset: r.offset })
  }
  return known
}

/**
 * Which of `keys` a produce to topic `topicId` would answer as duplicates, with their stored
 * coordinates: the lookup produce itself makes (findKnownKeys), without appending anything.
 */
export async function storedIdempotencyKeys(
  q: Queryable,
  topicId: number,
  keys: string[],
): Promise<{ key: string; partition: number; offset: number }[]> {
  const known = await findKnownKeys(
    q,
    keys.map((key) => ({ topicId, idempotencyKey: key })),
  )
  const found: { key: string; partition: number; offset: number }[] = []
  for (const key of new Set(keys)) {
    const at = known.get(idKey(topicId, key))
    if (at !== undefined) found.push({ key, partition: at.partition, offset: at.offset })
  }
  return found
}

// One bounded slice of a topic's idempotency keys past its retention, through (topic_id, produced_at).
const DELETE_EXPIRED_KEYS = `
DELETE FROM idempotency_keys i USING (
  SELECT topic_id, key FROM idempotency_keys
  WHERE topic_id = $1 AND produced_at < clock_timestamp() - $2::bigint * interval '1 millisecond'
  LIMIT $3
) doomed
WHERE i.topic_id = doomed.topic_id AND i.key = doomed.key`

/**
 * Deletes up to `limit` idempotency keys of the topic older than `retentionMs` (they no longer
 * deduplicate); returns how many. Rows deleted one by one, but only keyed messages have one.
 */
export async function deleteExpiredKeys(q: Queryable, topicId: number, retentionMs: number, limit: number): Promise<number> {
  const res = await q.query(DELETE_EXPIRED_KEYS, [topicId, retentionMs, limit])
  return res.rowCount ?? 0
}

/** The tables the retention sweep deletes rows from (the attempt log goes in whole partitions). */
export type SweptTable = 'messages' | 'idempotency_keys'

/**
 * Vacuums a table the sweep deletes rows from when the rows deleted since its last vacuum pass what
 * autovacuum waits for (50 + 20% of the rows it holds, PostgreSQL's defaults); returns whether it
 * did. For servers where autovacuum does not run: without it a deleted row's space is never reused
 * and the table grows with traffic. For messages, only the default partitions and messages_legacy:
 * rows are deleted (or moved) out of them alone, the chunks go whole. SKIP_LOCKED: a vacuum already running
 * (another process's) is not waited for.
 */
export async function vacuumIfDue(q: Queryable, table: SweptTable, deletedSinceVacuum: number): Promise<boolean> {
  const res = await q.query<{ name: string; rows: number }>(
    table === 'messages'
      ? `SELECT c.relname AS name, greatest(c.reltuples, 0)::float8 AS rows FROM pg_class c
         WHERE c.relkind = 'r' AND c.relname ~ '^messages_(default|legacy|t[0-9]+_default)$'`
      : `SELECT relname AS name, greatest(reltuples, 0)::float8 AS rows FROM pg_class WHERE oid = $1::regclass`,
    table === 'messages' ? [] : [table],
  )
  const rows = res.rows.reduce((n, r) => n + r.rows, 0)
  if (res.rows.length === 0 || deletedSinceVacuum < 50 + 0.2 * rows) return false
  await q.query(`VACUUM (SKIP_LOCKED) ${res.rows.map((r) => `"${r.name}"`).join(', ')}`)
  return true
}

// Per partition of the topic, its first row by the primary key (topic_id, partition, "offset", …):
// in each of the topic's chunks one index probe, merged (a Merge Append under LIMIT 1), instead of a
// min() over every row the topic keeps (measured: 0.5 ms and 94 buffers against 460 ms and 11,000
// for 400,000 rows in 7 chunks, docs/performance.md). An unnamed statement with the topic id a
// parameter: planned with its value, only that topic's chunks are opened (src/store/message-chunks.ts).
const FIRST_OFFSETS = `
SELECT p.partition, f."offset" AS first FROM topic_partitions p
CROSS JOIN LATERAL (
  SELECT m."offset" FROM messages m WHERE m.topic_id = $1 AND m.partition = p.partition ORDER BY m."offset" LIMIT 1
) f
WHERE p.topic_id = $1`

// The same from a time: min() over the rows from that time on, found through (topic_id,
// produced_at), chunks wholly before it pruned when planned. Not the probe by the key above: with
// produced_at a filter, it walks a partition's rows from its oldest until one matches, every row of
// a pre-chunk topic's partition (docs/performance.md, "First offsets").
const OFFSETS_AT_TIME = `SELECT partition, min("offset") AS first FROM messages WHERE topic_id = $1 AND produced_at >= $2 GROUP BY partition`

/**
 * The oldest offset kept per partition (retention takes the front); a partition with no message
 * kept is left out. What a fetch or a group starting at "earliest" below the retained range begins at.
 */
export async function firstOffsets(q: Queryable, topicId: number): Promise<Map<number, number>> {
  const res = await q.query<{ partition: number; first: number }>(FIRST_OFFSETS, [topicId])
  return new Map(res.rows.map((r) => [r.partition, r.first]))
}

/** Per partition, the first offset produced at or after `at` (left out: none yet). */
export async function offsetsAtTime(q: Queryable, topicId: number, at: Date): Promise<Map<number, number>> {
  const res = await q.query<{ partition: number; first: number }>(OFFSETS_AT_TIME, [topicId, at])
  return new Map(res.rows.map((r) => [r.partition, r.first]))
}

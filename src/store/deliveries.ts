/** Storage of push attempts: one row each, inserted when the push starts and updated with its outcome. */
import { numberArray, numberColumn, textColumn } from './arrays.ts'
import type { Queryable } from './db.ts'
import { parseDeliveryId, type AttemptKey } from '../core/delivery-id.ts'
import { storableText } from './storable.ts'

export type Outcome = 'in_flight' | 'acked' | 'failed' | 'timed_out' | 'nacked' | 'dead'

export interface AttemptStart {
  id: string
  groupId: number
  topicId: number
  partition: number
  offset: number
  attempt: number
  consumerId: string | null
  /** Times as epoch ms, not Dates: a row lives until its outcome, one per push, and a Date is an object each. */
  startedAtMs: number
  ackDeadlineMs: number
  /** Known before the row is written (the writer merges early updates into the insert). */
  outcome?: Outcome
  finishedAtMs?: number
  statusCode?: number
  durationMs?: number
  error?: string
}

/** A change to an attempt row; undefined fields keep their value. */
export interface AttemptUpdate {
  id: string
  outcome?: Outcome
  finishedAtMs?: number
  statusCode?: number
  durationMs?: number
  error?: string
  ackDeadlineMs?: number
}

export interface AttemptRow {
  deliveryId: string
  partition: number
  offset: number
  attempt: number
  consumerId: string | null
  startedAt: Date
  finishedAt: Date | null
  statusCode: number | null
  durationMs: number | null
  error: string | null
  outcome: Outcome
}

/**
 * Inserts attempt rows in one statement (outcome in_flight unless already known), a named one:
 * prepared once per connection, it skips PostgreSQL's parse and plan at every flush.
 *
 * A plain INSERT first: ON CONFLICT DO NOTHING made every row a speculative insertion (one more
 * WAL record a row, 15-25% of the statement's time). Rows can only exist already when a flush
 * committed and its answer was lost, so the writer sends them again: that retry meets a unique
 * violation, and then skips them.
 * (In a caller's transaction that violation would abort it: the attempt log passes the pool.)
 */
export async function insertAttempts(q: Queryable, rows: AttemptStart[]): Promise<void> {
  if (rows.length === 0) return
  const values = attemptValues(rows)
  try {
    await q.query({ name: 'hookq_insert_attempts', text: INSERT_ATTEMPTS, values })
  } catch (err) {
    if ((err as { code?: unknown }).code !== '23505') throw err
    await q.query({ name: 'hookq_insert_attempts_again', text: `${INSERT_ATTEMPTS} ON CONFLICT DO NOTHING`, values })
  }
}

function attemptValues(rows: AttemptStart[]): unknown[] {
  return [
    textColumn(rows, (r) => r.id),
    numberColumn(rows, (r) => r.groupId),
    numberColumn(rows, (r) => r.topicId),
    numberColumn(rows, (r) => r.partition),
    numberColumn(rows, (r) => r.offset),
    numberColumn(rows, (r) => r.attempt),
    textColumn(rows, (r) => r.consumerId),
    numberColumn(rows, (r) => r.startedAtMs),
    numberColumn(rows, (r) => r.ackDeadlineMs),
    textColumn(rows, (r) => r.outcome),
    numberColumn(rows, (r) => r.finishedAtMs),
    numberColumn(rows, (r) => r.statusCode),
    numberColumn(rows, (r) => r.durationMs),
    textColumn(rows, (r) => storableText(r.error)),
  ]
}

// filed_at, the partition key (src/store/attempt-partitions.ts), is the start of the attempt.
// A group or topic deleted meanwhile takes its attempts with it: rows of ids no longer there are
// left out (a semi-join, one look at each small table per statement, not two lookups per row).
const INSERT_ATTEMPTS = `
INSERT INTO deliveries (id, group_id, topic_id, partition, "offset", attempt, consumer_id, started_at, ack_deadline,
                        outcome, finished_at, status_code, duration_ms, error, filed_at)
SELECT u.id, u.group_id, u.topic_id, u.partition, u."offset", u.attempt, u.consumer_id, to_timestamp(u.started_at / 1000),
       to_timestamp(u.ack_deadline / 1000), coalesce(u.outcome, 'in_flight')::delivery_outcome, to_timestamp(u.finished_at / 1000),
       u.status_code, u.duration_ms, u.error, to_timestamp(u.started_at / 1000)
FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::bigint[], $6::int[], $7::text[], $8::float8[], $9::float8[],
            $10::text[], $11::float8[], $12::int[], $13::int[], $14::text[])
  AS u(id, group_id, topic_id, partition, "offset", attempt, consumer_id, started_at, ack_deadline,
       outcome, finished_at, status_code, duration_ms, error)
WHERE u.group_id IN (SELECT id FROM consumer_groups) AND u.topic_id IN (SELECT id FROM topics)`

/**
 * Applies attempt updates in one statement (each id at most once: merge before calling).
 *
 * `filedFromMs`, when the caller knows it: no row of these ids was filed (filed_at, the partition
 * key) before it, nor later than now. PostgreSQL then leaves out, when it plans the statement with
 * the values, every partition but the one or two of the rows, which would otherwise cost an index
 * probe each per row (a retention of days keeps ten or so, and two are always made ahead). Filing
 * can move a row later (a copy forward, a stray filed by maintenance, on another process's clock)
 * or earlier (a process whose clock is behind); so when the bounded statement finds fewer rows
 * than it was given, the unbounded one runs too (an update sets the same values again, so running
 * both changes nothing more).
 */
export async function updateAttempts(q: Queryable, rows: AttemptUpdate[], filedFromMs?: number): Promise<void> {
  const keyed = rows.flatMap((r) => {
    const k = parseDeliveryId(r.id)
    return k ? [{ k, r }] : []
  })
  if (keyed.length === 0) return
  const values = [
    numberArray(keyed.map(({ k }) => k.groupId)),
    numberArray(keyed.map(({ k }) => k.partition)),
    numberArray(keyed.map(({ k }) => k.offset)),
    numberArray(keyed.map(({ k }) => k.attempt)),
    keyed.map(({ r }) => r.id),
    keyed.map(({ r }) => r.outcome ?? null),
    numberArray(keyed.map(({ r }) => r.finishedAtMs)),
    numberArray(keyed.map(({ r }) => r.statusCode)),
    numberArray(keyed.map(({ r }) => r.durationMs)),
    keyed.map(({ r }) => storableText(r.error)),
    numberArray(keyed.map(({ r }) => r.ackDeadlineMs)),
  ]
  if (filedFromMs !== undefined && Number.isFinite(filedFromMs)) {
    // From a millisecond below (filed_at keeps milliseconds, rounded) to a minute past now (rows
    // filed by another process, whose clock may be ahead): the partitions ahead and the default
    // one are left out too.
    const bounded = await q.query(
      `${UPDATE_ATTEMPTS} AND d.filed_at >= to_timestamp($12 / 1000.0) AND d.filed_at <= to_timestamp($13 / 1000.0)`,
      [...values, filedFromMs - 1, Date.now() + 60_000],
    )
    if ((bounded.rowCount ?? 0) >= keyed.length) return
  }
  await q.query(UPDATE_ATTEMPTS, values)
}

// Unnamed (planned with its values each time), so that the bound above prunes at plan time.
const UPDATE_ATTEMPTS = `
UPDATE deliveries d SET
  outcome = coalesce(u.outcome::delivery_outcome, d.outcome),
  finished_at = coalesce(to_timestamp(u.finished_at / 1000), d.finished_at),
  status_code = coalesce(u.status_code, d.status_code),
  duration_ms = coalesce(u.duration_ms, d.duration_ms),
  error = coalesce(u.error, d.error),
  ack_deadline = coalesce(to_timestamp(u.ack_deadline / 1000), d.ack_deadline)
FROM unnest($1::int[], $2::int[], $3::bigint[], $4::int[], $5::text[], $6::text[], $7::float8[], $8::int[], $9::int[], $10::text[], $11::float8[])
  AS u(group_id, partition, "offset", attempt, id, outcome, finished_at, status_code, duration_ms, error, ack_deadline)
WHERE d.group_id = u.group_id AND d.partition = u.partition AND d."offset" = u."offset" AND d.attempt = u.attempt AND d.id = u.id`

/** An attempt found by its delivery id. */
export type FoundAttempt = AttemptKey & { topicId: number; startedAtMs: number }

/**
 * The attempts these delivery ids name, among this group's, in one statement (by primary key: the
 * ids carry it); ids of other groups, or not ours, are not looked up. Keyed by delivery id.
 */
export async function findAttempts(q: Queryable, groupId: number, ids: string[]): Promise<Map<string, FoundAttempt>> {
  const keyed = ids.flatMap((id) => {
    const k = parseDeliveryId(id)
    return k && k.groupId === groupId ? [{ id, k }] : []
  })
  const found = new Map<string, FoundAttempt>()
  if (keyed.length === 0) return found
  const res = await q.query<{ id: string; topic_id: number; started_at: Date }>(
    `SELECT d.id, d.topic_id, d.started_at FROM deliveries d
     JOIN unnest($2::int[], $3::bigint[], $4::int[], $5::text[]) AS u(p, o, a, id)
       ON d.group_id = $1 AND d.partition = u.p AND d."offset" = u.o AND d.attempt = u.a AND d.id = u.id`,
    [
      groupId,
      numberArray(keyed.map(({ k }) => k.partition)),
      numberArray(keyed.map(({ k }) => k.offset)),
      numberArray(keyed.map(({ k }) => k.attempt)),
      keyed.map(({ id }) => id),
    ],
  )
  const keys = new Map(keyed.map(({ id, k }) => [id, k]))
  for (const r of res.rows) found.set(r.id, { ...keys.get(r.id)!, topicId: r.topic_id, startedAtMs: r.started_at.getTime() })
  return found
}

/**
 * Attempts of a group, newest first, after an optional (startedAt, id) cursor, filed at or after
 * `filedSinceMs`: the attempt log's retention, which rows keep until their whole partition goes
 * (the partitions before it are not read at all). A row the retention carried forward (the newest
 * attempt of a message in progress) is filed anew, and listed as before.
 */
export async function listAttempts(
  q: Queryable,
  groupId: number,
  f: {
    partition?: number
    offset?: number
    outcome?: Outcome
    limit: number
    after?: { startedAt: Date; id: string }
    filedSinceMs?: number
  },
): Promise<AttemptRow[]> {
  // Rows written before the log was partitioned have no filing time ('-infinity', the migration's
  // constant default, which spared rewriting them): their start time says.
  const where = [
    'group_id = $1',
    `(filed_at >= to_timestamp($2 / 1000.0) OR (filed_at = '-infinity' AND started_at >= to_timestamp($2 / 1000.0)))`,
  ]
  const params: unknown[] = [groupId, f.filedSinceMs ?? 0]
  const add = (sql: string, value: unknown) => {
    params.push(value)
    where.push(sql.replace('?', `$${params.length}`))
  }
  if (f.partition !== undefined) add('partition = ?', f.partition)
  if (f.offset !== undefined) add('"offset" = ?', f.offset)
  if (f.outcome !== undefined) add('outcome = ?::delivery_outcome', f.outcome)
  if (f.after) {
    params.push(f.after.startedAt, f.after.id)
    where.push(`(started_at, id) < ($${params.length - 1}, $${params.length})`)
  }
  params.push(f.limit)
  const res = await q.query<{
    id: string
    partition: number
    offset: number
    attempt: number
    consumer_id: string | null
    started_at: Date
    finished_at: Date | null
    status_code: number | null
    duration_ms: number | null
    error: string | null
    outcome: Outcome
  }>(
    `SELECT id, partition, "offset", attempt, consumer_id, started_at, finished_at, status_code, duration_ms, error, outcome
     FROM deliveries WHERE ${where.join(' AND ')} ORDER BY started_at DESC, id DESC LIMIT $${params.length}`,
    params,
  )
  return res.rows.map((r) => ({
    deliveryId: r.id,
    partition: r.partition,
    offset: r.offset,
    attempt: r.attempt,
    consumerId: r.consumer_id,
    startedAt: r.started_at,
    finishedAt: r.finished_at,
    statusCode: r.status_code,
    durationMs: r.duration_ms,
    error: r.error,
    outcome: r.outcome,
  }))
}

/**
 * Marks attempts left in flight by a previous process as failed (run when a partition is acquired),
 * but for `keep`: attempts handed over in flight that the new owner takes on as its own (see
 * handedOverInFlight), whose consumer may still ack, nack or extend them.
 */
export async function abandonInFlight(q: Queryable, groupId: number, partition: number, keep: readonly string[] = []): Promise<void> {
  await q.query(
    `UPDATE deliveries SET outcome = 'failed', finished_at = coalesce(finished_at, clock_timestamp()),
       error = coalesce(error, 'the broker stopped before the outcome was known')
     WHERE group_id = $1 AND partition = $2 AND outcome = 'in_flight' AND NOT (id = ANY($3::text[]))`,
    [groupId, partition, [...keep]],
  )
}

/**
 * The error of an attempt row left in flight by a graceful handover: its push was answered and the
 * consumer may still ack it, so the partition's next owner waits for its ack deadline before
 * pushing the message again (handedOverInFlight), instead of pushing a duplicate at once.
 */
export const HANDED_OVER = 'in flight when its partition was handed to another broker process'

/**
 * The error of an attempt row handed over in flight and nacked while nobody held its partition
 * (src/store/membership.ts settleUnowned): its ack_deadline then says when the next owner may push
 * the message again (the nack's delay), as a handed-over attempt's says it for its ack deadline.
 */
export const NACKED_UNOWNED = 'nacked while its partition moved between broker processes'

/** A nack or an extend of attempts handed over in flight: `untilMs(id)` is when the message may go again (nack) or its new ack deadline (extend). */
export interface HandedOverChange {
  verb: 'nack' | 'extend'
  untilMs(id: string): number
}

/**
 * A nack or an extend of attempts handed over in flight (HANDED_OVER), written to their rows while
 * nobody holds the partition: the ids whose rows it changed. The next owner reads them (handedOverInFlight).
 */
export async function settleHandedOver(
  q: Queryable,
  groupId: number,
  partition: number,
  ids: string[],
  change: HandedOverChange,
): Promise<Set<string>> {
  const keyed = ids.flatMap((id) => {
    const k = parseDeliveryId(id)
    return k && k.groupId === groupId && k.partition === partition ? [{ id, k }] : []
  })
  if (keyed.length === 0) return new Set()
  const nack = change.verb === 'nack'
  const { rows } = await q.query<{ id: string }>(
    `UPDATE deliveries d SET ack_deadline = to_timestamp(u.until / 1000),
       outcome = CASE WHEN $7 THEN 'nacked'::delivery_outcome ELSE d.outcome END,
       error = CASE WHEN $7 THEN $8 ELSE d.error END,
       finished_at = CASE WHEN $7 THEN clock_timestamp() ELSE d.finished_at END
     FROM unnest($3::bigint[], $4::int[], $5::text[], $6::float8[]) AS u(o, a, id, until)
     WHERE d.group_id = $1 AND d.partition = $2 AND d."offset" = u.o AND d.attempt = u.a AND d.id = u.id
       AND d.outcome = 'in_flight' AND d.error = $9
     RETURNING d.id`,
    [
      groupId,
      partition,
      numberArray(keyed.map(({ k }) => k.offset)),
      numberArray(keyed.map(({ k }) => k.attempt)),
      keyed.map(({ id }) => id),
      keyed.map(({ id }) => change.untilMs(id)),
      nack,
      NACKED_UNOWNED,
      HANDED_OVER,
    ],
  )
  return new Set(rows.map((r) => r.id))
}

/** What the next owner of a partition finds of a message's last attempt handed over (handedOverInFlight). */
export interface HandedOver {
  /** The attempt's ack deadline, or (nacked while nobody held the partition) when the message may go again, epoch ms; still to come. */
  untilMs: number
  /**
   * The attempt still in flight (HANDED_OVER): its push was answered and its ack may still come, so
   * the next owner takes it on as its own attempt in flight, with this deadline. Undefined when nacked.
   */
  inFlight: { id: string; attempt: number; consumerId: string | null } | undefined
}

/**
 * The last attempt of each message that a graceful handover left in flight on a partition (or that
 * was nacked since, NACKED_UNOWNED), by offset: those whose deadline (or whose nack's delay) is
 * still to come, from `fromOffset` on, and not from before the partition's last seek.
 */
export async function handedOverInFlight(
  q: Queryable,
  groupId: number,
  partition: number,
  fromOffset: number,
  seekedAtMs = 0,
): Promise<Map<number, HandedOver>> {
  const { rows } = await q.query<{
    offset: number
    id: string
    attempt: number
    consumer_id: string | null
    outcome: string
    until: number
  }>(
    `SELECT DISTINCT ON ("offset") "offset", id, attempt, consumer_id, outcome::text AS outcome,
            (extract(epoch from ack_deadline) * 1000)::float8 AS until
     FROM deliveries
     WHERE group_id = $1 AND partition = $2 AND "offset" >= $3 AND ack_deadline > now() AND started_at >= to_timestamp($6 / 1000.0)
       AND ((outcome = 'in_flight' AND error = $4) OR (outcome = 'nacked' AND error = $5))
     ORDER BY "offset", attempt DESC, ack_deadline DESC`,
    [groupId, partition, fromOffset, HANDED_OVER, NACKED_UNOWNED, seekedAtMs],
  )
  return new Map(
    rows.map((r) => [
      Number(r.offset),
      {
        untilMs: r.until,
        inFlight: r.outcome === 'in_flight' ? { id: r.id, attempt: Number(r.attempt), consumerId: r.consumer_id } : undefined,
      },
    ]),
  )
}

/**
 * The produce outbox in SQL: rows hookq_produce() inserted in applications' transactions (the
 * function is in the transactional_produce migration), moved into the log by the broker. Why it
 * is built this way: src/service/outbox.ts.
 */
import type { Database, Queryable } from './db.ts'
import { isAnswerLost } from '../core/database-errors.ts'
import { appendDeduplicated, appendRows, findKnownKeys, withAppendRetries, type AppendEntry, type Coordinates } from './messages.ts'

/** A committed outbox row, with its topic as it is now (null: deleted since). */
export interface OutboxRow {
  id: number
  topicId: number
  /** The topic's name and partition count; null when the topic was deleted after the row was written. */
  topic: { name: string; partitions: number } | null
  key: string | null
  value: string
  headers: string
  delayMs: number
  idempotencyKey: string | null
}

/** What one move did: the rows taken, and for each the entry appended and where it landed (null: dropped). */
export interface Moved {
  rows: OutboxRow[]
  /** Rows were left for the next move by the byte bound (more are waiting). */
  cut: boolean
  entries: (AppendEntry | null)[]
  coordinates: (Coordinates | null)[]
}

// Taken by the moving transaction: one mover at a time across processes, so rows go into the log
// in the order they became visible. (Without it two movers would still not move a row twice: the
// second's DELETE waits on the first's row locks and then finds the rows gone.)
const MOVER_LOCK_KEY = 0x686b714f // "hkqO"

// The oldest waiting row, by the primary key: one index probe, however many dead rows the last
// burst left behind for vacuum.
const ANY_WAITING = 'SELECT id FROM produce_outbox ORDER BY id LIMIT 1'

// The oldest rows, at most $1 of them and at most $2 bytes in all, but always the oldest one
// however large: a batch's values are joined into one text (appendRows), and JavaScript strings
// stop at ~512 Mi characters, so six 250 MiB values in one batch could never be moved. octet_length
// of a stored text reads its size from the TOAST pointer, without fetching the value. "cut": rows
// were left behind for the byte bound (the mover goes on at once, as after a full batch).
const TAKE = `
WITH limited AS (
  SELECT id, row_number() OVER w AS n,
         sum(octet_length(value) + octet_length(headers) + coalesce(octet_length(key), 0)) OVER w AS upto
  FROM (SELECT id, key, value, headers FROM produce_outbox ORDER BY id LIMIT $1) o
  WINDOW w AS (ORDER BY id ROWS UNBOUNDED PRECEDING)
), picked AS (
  SELECT id FROM limited WHERE n = 1 OR upto <= $2
), taken AS (
  DELETE FROM produce_outbox WHERE id IN (SELECT id FROM picked)
  RETURNING id, topic_id, key, value, headers, delay_ms, idempotency_key
)
SELECT taken.*, t.name AS topic_name, t.partitions,
       (SELECT count(*) FROM limited) > (SELECT count(*) FROM picked) AS cut
FROM taken LEFT JOIN topics t ON t.id = taken.topic_id
ORDER BY taken.id`

// A row that cannot be moved goes, whole and in one statement (its value never leaves the
// database), to produce_outbox_set_aside with the reason.
const SET_ASIDE = `
WITH gone AS (DELETE FROM produce_outbox WHERE id = $1 RETURNING *)
INSERT INTO produce_outbox_set_aside (id, topic_id, key, value, headers, delay_ms, idempotency_key, created_at, reason)
SELECT id, topic_id, key, value, headers, delay_ms, idempotency_key, created_at, $2 FROM gone
ON CONFLICT (id) DO NOTHING`

/**
 * Deletes set-aside rows set aside more than `keepMs` ago (the attempt log's retention: both are a
 * record of what went wrong, kept for an operator to look at); returns how many. A row per refused
 * message, so plain deletes: bounded by what is refused, not by traffic.
 */
export async function deleteExpiredSetAside(q: Queryable, keepMs: number): Promise<number> {
  const res = await q.query(
    `DELETE FROM produce_outbox_set_aside WHERE set_aside_at < clock_timestamp() - $1::bigint * interval '1 millisecond'`,
    [keepMs],
  )
  return res.rowCount ?? 0
}

/** Whether a committed row waits to be moved. */
export async function outboxWaiting(q: Queryable): Promise<boolean> {
  return (await oldestWaitingId(q)) !== null
}

/** The id of the oldest committed row waiting to be moved (null: none). */
export async function oldestWaitingId(q: Queryable): Promise<number | null> {
  const res = await q.query<{ id: string }>({ name: 'hookq_outbox_any', text: ANY_WAITING })
  return res.rows[0] ? Number(res.rows[0].id) : null
}

/**
 * Moves outbox row `id` to produce_outbox_set_aside with `reason` (made storable: no NUL, well
 * formed, at most 500 characters); false when it was gone already.
 */
export async function setAsideOutboxRow(q: Queryable, id: number, reason: string): Promise<boolean> {
  const text = reason.replaceAll('\u0000', '\uFFFD').slice(0, 500).toWellFormed()
  return ((await q.query(SET_ASIDE, [id, text])).rowCount ?? 0) > 0
}

/**
 * Whether a move failed for something in its rows rather than for the database's state: a value too
 * large for JavaScript's strings (RangeError), or PostgreSQL refusing the data (class 22, data
 * exception; 23 but a unique violation, which a concurrent producer causes; 54, program limit).
 * Anything else (connection, shutdown, locks, a missing table) is no row's fault and is retried.
 */
export function isRowFault(err: unknown): boolean {
  if (err instanceof RangeError) return true
  const code = (err as { code?: unknown } | null)?.code
  return typeof code === 'string' && /^(22|23(?!505)|54)[0-9A-Z]{3}$/.test(code)
}

/** How much one move takes at most: rows, and bytes of values, headers and keys (the oldest row always). */
export interface MoveLimits {
  rows: number
  bytes: number
}

/** A move that failed, with the ids of the rows it had taken (empty: it failed before taking any). */
export class MoveFailed extends Error {
  override name = 'MoveFailed'
  constructor(
    readonly ids: number[],
    override readonly cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause })
  }
}

/** Seconds since the oldest waiting row was written (0: none waits); one index probe. */
export async function oldestWaitingSeconds(q: Queryable): Promise<number> {
  const res = await q.query<{ s: number }>(
    'SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 AS s FROM produce_outbox ORDER BY id LIMIT 1',
  )
  return Math.max(0, res.rows[0]?.s ?? 0)
}

/**
 * Moves up to `limit` rows (and bytes), oldest first, into the log in one transaction: they are deleted from
 * the outbox, deduplicated by idempotency key against the log (HTTP produce's keys included) and
 * appended, and all of it commits or none of it does. `place` chooses each row's entry (its
 * partition); null drops the row (its topic is gone). Resolves with null when another process is
 * moving rows at the moment. Fails with MoveFailed, naming the rows it had taken.
 */
export function moveOutbox(db: Database, limit: MoveLimits, place: (row: OutboxRow) => AppendEntry | null): Promise<Moved | null> {
  // A concurrent HTTP produce of the same idempotency key fails the append on idempotency_keys' primary key:
  // the move rolls back whole and runs again, and then finds the key.
  const taken = { ids: [] as number[] }
  return withAppendRetries(() => moveOnce(db, limit, place, taken)).catch((err: unknown) => {
    throw new MoveFailed(taken.ids, err)
  })
}

async function moveOnce(
  db: Database,
  limit: MoveLimits,
  place: (row: OutboxRow) => AppendEntry | null,
  taken: { ids: number[] },
): Promise<Moved | null> {
  taken.ids = []
  const client = await db.pool.connect()
  let broken = false
  try {
    await client.query('BEGIN')
    try {
      const locked = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1) AS ok', [MOVER_LOCK_KEY])
      if (!locked.rows[0]!.ok) {
        await client.query('ROLLBACK')
        return null
      }
      const res = await client.query<{
        id: number
        topic_id: number
        key: string | null
        value: string
        headers: string
        delay_ms: number
        idempotency_key: string | null
        topic_name: string | null
        partitions: number | null
        cut: boolean
      }>({ name: 'hookq_outbox_take', text: TAKE }, [limit.rows, limit.bytes])
      const rows: OutboxRow[] = res.rows.map((r) => ({
        id: r.id,
        topicId: r.topic_id,
        topic: r.topic_name === null ? null : { name: r.topic_name, partitions: r.partitions! },
        key: r.key,
        value: r.value,
        headers: r.headers,
        delayMs: r.delay_ms,
        idempotencyKey: r.idempotency_key,
      }))
      taken.ids = rows.map((r) => Number(r.id))
      const entries = rows.map(place)
      const kept = entries.filter((e): e is AppendEntry => e !== null)
      const appended =
        kept.length === 0
          ? []
          : await appendDeduplicated(
              kept,
              (all) => findKnownKeys(client, all),
              (fresh) => appendRows(client, fresh),
            )
      await client.query('COMMIT')
      let at = 0
      return { rows, cut: res.rows[0]?.cut ?? false, entries, coordinates: entries.map((e) => (e === null ? null : appended[at++]!)) }
    } catch (err) {
      // A connection that broke mid-transaction rolls back on the server by itself.
      if (isAnswerLost(err)) broken = true
      else
        await client.query('ROLLBACK').catch(() => {
          broken = true
        })
      throw err
    }
  } finally {
    client.release(broken)
  }
}

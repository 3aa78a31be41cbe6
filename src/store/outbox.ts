/**
 * The produce outbox in SQL: rows hookq_produce() inserted in applications' transactions (the
 * function is in the transactional_produce migration), moved into the log by the broker. Why it
 * is built this way: src/service/outbox.ts.
 */
import type { Database, Queryable } from './db.ts'
import { isAnswerLost } from './errors.ts'
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

const TAKE = `
WITH taken AS (
  DELETE FROM produce_outbox WHERE id IN (SELECT id FROM produce_outbox ORDER BY id LIMIT $1)
  RETURNING id, topic_id, key, value, headers, delay_ms, idempotency_key
)
SELECT taken.*, t.name AS topic_name, t.partitions
FROM taken LEFT JOIN topics t ON t.id = taken.topic_id
ORDER BY taken.id`

/** Whether a committed row waits to be moved. */
export async function outboxWaiting(q: Queryable): Promise<boolean> {
  return ((await q.query({ name: 'hookq_outbox_any', text: ANY_WAITING })).rowCount ?? 0) > 0
}

/** Seconds since the oldest waiting row was written (0: none waits); one index probe. */
export async function oldestWaitingSeconds(q: Queryable): Promise<number> {
  const res = await q.query<{ s: number }>(
    'SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 AS s FROM produce_outbox ORDER BY id LIMIT 1',
  )
  return Math.max(0, res.rows[0]?.s ?? 0)
}

/**
 * Moves up to `limit` rows, oldest first, into the log in one transaction: they are deleted from
 * the outbox, deduplicated by idempotency key against the log (HTTP produce's keys included) and
 * appended, and all of it commits or none of it does. `place` chooses each row's entry (its
 * partition); null drops the row (its topic is gone). Resolves with null when another process is
 * moving rows at the moment.
 */
export function moveOutbox(db: Database, limit: number, place: (row: OutboxRow) => AppendEntry | null): Promise<Moved | null> {
  // A concurrent HTTP produce of the same idempotency key fails the append on the unique index:
  // the move rolls back whole and runs again, and then finds the key.
  return withAppendRetries(() => moveOnce(db, limit, place))
}

async function moveOnce(db: Database, limit: number, place: (row: OutboxRow) => AppendEntry | null): Promise<Moved | null> {
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
      }>({ name: 'hookq_outbox_take', text: TAKE }, [limit])
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
      return { rows, entries, coordinates: entries.map((e) => (e === null ? null : appended[at++]!)) }
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

/**
 * The messages table's chunks (messages is partitioned by range of (topic_id, produced_at); see the
 * migration 20261206200000_message_chunks): each chunk holds one topic's messages of a span of time,
 * made ahead of time and dropped whole once its end is past the topic's retention, so retention
 * deletes no rows: no dead rows, no vacuum, whatever the produce rate (docs/performance.md,
 * "Messages in chunks"). A message is therefore kept at least its topic's retentionMs and at most a
 * span and a sweep interval more, as Kafka keeps whole segments.
 *
 * A chunk is named messages_<topic>_<from>_<to>, its bounds in ms since the epoch (0: from the
 * start). Spans are the attempt log's (attemptPartitionPlan: a quarter of the retention, 30 s to a
 * day), aligned on multiples of the span, covering from a span ago to `aheadMs` ahead: made at
 * start-up, for a new topic when it is created, and by every sweep. A row that finds no chunk (its
 * topic's creation failed to make them; a row a test aged) goes to messages_default;
 * each maintenance deletes its rows past their topic's retention and files the others into the
 * chunks made for them (those older than every chunk stay in the default until they expire).
 *
 * Reads are unchanged: offsets are dense and only the front of a partition goes, so a read below
 * the oldest offset kept starts at it. A message in flight whose chunk goes keeps its attempt (the
 * attempt log's copy-forward keeps in-flight attempts whatever their message's fate), and its
 * consumer's ack completes it.
 *
 * One process at a time (a transaction-scoped advisory lock); creating and dropping chunks take
 * PostgreSQL's exclusive lock on messages for a moment (DETACH ... CONCURRENTLY is refused while a
 * default partition exists), bounded by lock_timeout: a maintenance that times out is retried at
 * the next sweep, the chunks it would have dropped kept a little longer.
 */
import type pg from 'pg'
import { attemptPartitionPlan, partitionsToCreate } from './attempt-partitions.ts'

/** "hkqC": the messages table's chunk maintenance. */
const MAINTENANCE_LOCK_KEY = 0x686b7143
const NAME = /^messages_(\d+)_(\d+)_(\d+)$/
const DEFAULT_PARTITION = 'messages_default'

export interface MessageChunk {
  name: string
  topicId: number
  fromMs: number
  toMs: number
}

export interface ChunkMaintenanceResult {
  /** False: another process was maintaining; nothing was done. */
  ran: boolean
  created: string[]
  dropped: string[]
  /** Messages of the dropped chunks. */
  droppedRows: number
  /** Messages deleted from the default partition (past their retention, or of a topic gone). */
  strayRows: number
}

export interface ChunkMaintenanceOptions {
  /** The topics with their retention; chunks of a topic not among them (deleted) are dropped. */
  topics: { id: number; retentionMs: number }[]
  /** How often the sweep runs, ms (chunks are made far enough ahead to outlast a few missed sweeps). */
  sweepIntervalMs: number
  /** Wait for another process's maintenance instead of skipping. */
  wait?: boolean
  /** How long to wait for the exclusive lock on messages, ms. */
  lockTimeoutMs?: number
  /** Chunks ending at or before this minus their topic's retention go (default the database's clock; a test's later clock drops more). */
  nowMs?: number
}

/** The chunks of messages (by name), oldest first per topic. */
export async function listMessageChunks(q: Pick<pg.ClientBase, 'query'>): Promise<MessageChunk[]> {
  const { rows } = await q.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'messages'::regclass`,
  )
  return rows
    .flatMap((r) => {
      const m = NAME.exec(r.name)
      return m ? [{ name: r.name, topicId: Number(m[1]), fromMs: Number(m[2]), toMs: Number(m[3]) }] : []
    })
    .sort((a, b) => a.topicId - b.topicId || a.toMs - b.toMs)
}

const bound = (topicId: number, ms: number) => (ms === 0 ? `(${topicId}, MINVALUE)` : `(${topicId}, '${new Date(ms).toISOString()}')`)

// Default partition rows past their topic's retention (or of a topic gone) make a maintenance due.
const STRAYS_DUE = `
SELECT 1 FROM ${DEFAULT_PARTITION} d LEFT JOIN topics t ON t.id = d.topic_id
WHERE t.id IS NULL OR d.produced_at < clock_timestamp() - t.retention_ms * interval '1 millisecond' LIMIT 1`

/**
 * Makes the chunks due and drops those past their topic's retention, in one transaction on a
 * client of its own. Judged by the database's clock, which stamps produced_at.
 */
export async function maintainMessageChunks(pool: pg.Pool, opts: ChunkMaintenanceOptions): Promise<ChunkMaintenanceResult> {
  const result: ChunkMaintenanceResult = { ran: false, created: [], dropped: [], droppedRows: 0, strayRows: 0 }
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    try {
      if (opts.wait) {
        await client.query('SELECT pg_advisory_xact_lock($1)', [MAINTENANCE_LOCK_KEY])
      } else {
        const locked = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1) AS ok', [MAINTENANCE_LOCK_KEY])
        if (!locked.rows[0]!.ok) {
          await client.query('ROLLBACK')
          return result
        }
      }
      const nowMs = (await client.query<{ ms: number }>('SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS ms')).rows[0]!.ms
      const topics = new Map(opts.topics.map((t) => [t.id, t.retentionMs]))
      const all = await listMessageChunks(client)
      const doomed = all.filter((c) => {
        const retentionMs = topics.get(c.topicId)
        return retentionMs === undefined || c.toMs <= (opts.nowMs ?? nowMs) - retentionMs
      })
      const created: MessageChunk[] = []
      for (const [topicId, retentionMs] of topics) {
        const kept = all.filter((c) => c.topicId === topicId && !doomed.includes(c))
        const plan = attemptPartitionPlan(retentionMs, opts.sweepIntervalMs)
        for (const p of partitionsToCreate(kept, nowMs, plan)) {
          created.push({ name: `messages_${topicId}_${p.fromMs}_${p.toMs}`, topicId, fromMs: p.fromMs, toMs: p.toMs })
        }
      }
      const strays = await client.query(STRAYS_DUE)
      if (doomed.length > 0 || created.length > 0 || strays.rows.length > 0) {
        // Counted before the exclusive lock: their rows are all in the past.
        for (const c of doomed) {
          const n = await client.query<{ n: number }>(`SELECT count(*)::float8 AS n FROM "${c.name}"`)
          result.droppedRows += n.rows[0]!.n
        }
        await client.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.round(opts.lockTimeoutMs ?? 2000))}`)
        await client.query('LOCK TABLE messages IN ACCESS EXCLUSIVE MODE')
        for (const c of doomed) {
          await client.query(`ALTER TABLE messages DETACH PARTITION "${c.name}"`)
          await client.query(`DROP TABLE "${c.name}"`)
        }
        // The default partition's rows out first: a chunk is not made over rows the default holds.
        await client.query('CREATE TEMP TABLE hookq_message_strays (LIKE messages) ON COMMIT DROP')
        await client.query(`WITH d AS (DELETE FROM ${DEFAULT_PARTITION} RETURNING *) INSERT INTO hookq_message_strays SELECT * FROM d`)
        for (const c of created) {
          await client.query(
            `CREATE TABLE "${c.name}" PARTITION OF messages FOR VALUES FROM ${bound(c.topicId, c.fromMs)} TO ${bound(c.topicId, c.toMs)}`,
          )
        }
        // Strays within their topic's retention go back: into the chunks made for them, or the default.
        const back = await client.query(
          `INSERT INTO messages SELECT s.* FROM hookq_message_strays s JOIN topics t ON t.id = s.topic_id
           WHERE s.produced_at >= clock_timestamp() - t.retention_ms * interval '1 millisecond'`,
        )
        const past = await client.query<{ n: number }>('SELECT count(*)::float8 AS n FROM hookq_message_strays')
        result.strayRows = past.rows[0]!.n - (back.rowCount ?? 0)
        result.created = created.map((c) => c.name)
        result.dropped = doomed.map((c) => c.name)
      }
      await client.query('COMMIT')
      result.ran = true
      return result
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {})
      throw err
    }
  } finally {
    client.release()
  }
}

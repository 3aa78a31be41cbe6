/**
 * The attempt log's partitions (deliveries is partitioned by range of filed_at; see the migration
 * 20261206164500_attempt_log_partitions): made ahead of time, and dropped whole once everything in
 * them is past the retention, so the log sheds old attempts without deleting rows — no dead rows,
 * no vacuum, whatever the push rate (a DELETE per row left one dead row per attempt, which only
 * vacuum reclaims; measured in docs/performance.md).
 *
 * A partition is named deliveries_<from>_<to>, its bounds in ms since the epoch (0: from the start).
 * Partitions span `spanMs` each, aligned on multiples of it (the first after the migration starts
 * where the migrated table's ends), and cover from now on to `aheadMs` ahead, so a row finds its
 * partition while maintenance runs at least that often. A row that finds none goes to
 * deliveries_default, which each maintenance empties: its rows go to the current partition (those
 * past the retention only if they must be kept, as below).
 *
 * Dropping keeps what attempt counts need. A restart or a new owner counts a message's attempts
 * from the largest attempt number among its rows (attemptCounts in consumption.ts), so before a
 * partition goes, the newest of its rows of every message its group has not completed (still in
 * the log) is copied forward, with filed_at now, into the current partition; the rest goes with the
 * partition. Completed messages (below the committed offset, or among the completions) are never
 * pushed again, and a message deleted by its topic's retention neither; but an attempt still in
 * flight is kept whatever its message's fate, so its consumer's ack (nack, extend) finds it.
 *
 * One process at a time (a transaction-scoped advisory lock: the others wait, or skip their turn),
 * so nothing is copied or dropped twice. Creating and dropping partitions take PostgreSQL's
 * exclusive lock on deliveries for a moment (the copy is an index probe per group partition, and
 * rows of messages still in progress); lock_timeout bounds the wait, since every attempt-log
 * statement queues behind a waiting exclusive lock, and a maintenance that times out is retried at
 * the next sweep.
 */
import type pg from 'pg'
import { partitionStarts } from './storage.ts'

/** "hkqP": the attempt log's partition maintenance. */
const MAINTENANCE_LOCK_KEY = 0x686b7150
const NAME = /^deliveries_(\d+)_(\d+)$/
const DEFAULT_PARTITION = 'deliveries_default'
const COLUMNS = `id, group_id, topic_id, partition, "offset", attempt, consumer_id, started_at, finished_at,
  ack_deadline, status_code, duration_ms, error, outcome`

export interface PartitionPlan {
  /** Span of each new partition, ms. */
  spanMs: number
  /** New partitions cover up to this far past now, ms. */
  aheadMs: number
}

/** A partition span for a retention: a quarter of it, between 30 s and a day (so 5 to ~10 partitions live). */
export function attemptPartitionPlan(retentionMs: number, sweepIntervalMs: number): PartitionPlan {
  const spanMs = Math.min(86_400_000, Math.max(30_000, Math.floor(retentionMs / 4)))
  // Ahead by two spans, and by three sweeps, so a few missed sweeps leave no row without a partition.
  return { spanMs, aheadMs: Math.max(2 * spanMs, 3 * sweepIntervalMs) }
}

export interface AttemptPartition {
  name: string
  fromMs: number
  toMs: number
}

export interface MaintenanceResult {
  /** False: another process was maintaining (or held the lock too long); nothing was done. */
  ran: boolean
  created: string[]
  dropped: string[]
  /** Rows of the dropped partitions (and of the default partition's past the retention), those copied forward included. */
  droppedRows: number
  /** Rows copied forward (the newest attempt of messages still in progress). */
  keptRows: number
}

/** The partitions of deliveries that this module made (by name), oldest first. */
export async function listAttemptPartitions(q: Pick<pg.ClientBase, 'query'>): Promise<AttemptPartition[]> {
  const { rows } = await q.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'deliveries'::regclass`,
  )
  return rows
    .flatMap((r) => {
      const m = NAME.exec(r.name)
      return m ? [{ name: r.name, fromMs: Number(m[1]), toMs: Number(m[2]) }] : []
    })
    .sort((a, b) => a.toMs - b.toMs)
}

/**
 * The partitions to make so that [nowMs - spanMs, nowMs + aheadMs) is covered, around those kept:
 * aligned spans, cut short where a kept partition begins (the migrated table's end, or partitions a
 * test's later clock left ahead of a dropped range).
 */
export function partitionsToCreate(kept: AttemptPartition[], nowMs: number, plan: PartitionPlan): AttemptPartition[] {
  const wanted: AttemptPartition[] = []
  const floor = (ms: number) => Math.floor(ms / plan.spanMs) * plan.spanMs
  let from = floor(nowMs - plan.spanMs)
  while (from < nowMs + plan.aheadMs) {
    const covering = kept.find((p) => p.fromMs <= from && from < p.toMs)
    if (covering) {
      from = covering.toMs
      continue
    }
    const nextKept = Math.min(...kept.filter((p) => p.fromMs > from).map((p) => p.fromMs))
    const to = Math.min(floor(from) + plan.spanMs, nextKept)
    wanted.push({ name: `deliveries_${from}_${to}`, fromMs: from, toMs: to })
    from = to
  }
  return wanted
}

// The newest row in the dropped partitions of every message its group has not completed and its
// topic still keeps, filed now. "Still keeps": not below its partition's first offset kept ($2-$4,
// read before the maintenance's transaction, topic by topic: reading messages here would lock every
// topic's chunks in this one transaction; read earlier, a first offset can only be lower than now,
// which keeps a row more, never one less). Newest by attempt number among those since the partition's last seek
// (what attemptCounts counts), not by start time: processes' clocks differ. By group partition from the committed offset up (the primary key's
// prefix), so the partitions are read where messages are in progress, not whole.
const copyForward = (tables: string[]) => `
INSERT INTO deliveries (${COLUMNS}, filed_at)
SELECT DISTINCT ON (d.group_id, d.partition, d."offset")
       d.id, d.group_id, d.topic_id, d.partition, d."offset", d.attempt, d.consumer_id, d.started_at, d.finished_at,
       d.ack_deadline, d.status_code, d.duration_ms, d.error, d.outcome, to_timestamp($1 / 1000.0)
FROM group_offsets o
CROSS JOIN LATERAL (
  ${tables
    .map(
      (t) => `SELECT ${COLUMNS} FROM "${t}" x
  WHERE x.group_id = o.group_id AND x.partition = o.partition AND x.topic_id = o.topic_id AND x."offset" >= o.committed_offset`,
    )
    .join('\n  UNION ALL\n  ')}
) d
WHERE NOT EXISTS (SELECT 1 FROM group_completions c
                  WHERE c.group_id = d.group_id AND c.topic_id = d.topic_id AND c.partition = d.partition AND c."offset" = d."offset")
  AND (d.outcome = 'in_flight'
       OR NOT EXISTS (SELECT 1 FROM unnest($2::int[], $3::int[], $4::bigint[]) AS k(topic_id, partition, first)
                      WHERE k.topic_id = d.topic_id AND k.partition = d.partition AND d."offset" < k.first))
ORDER BY d.group_id, d.partition, d."offset", (o.seeked_at IS NULL OR d.started_at >= o.seeked_at) DESC, d.attempt DESC, d.started_at DESC`

export interface MaintenanceOptions {
  /** The clock partitions are made by (the process's own). */
  nowMs: number
  /** Partitions ending at or before this go (now minus the retention; a test's later clock drops more). */
  cutoffMs: number
  plan: PartitionPlan
  /** Wait for another process's maintenance instead of skipping (at start-up, before any attempt is written). */
  wait?: boolean
  /** How long to wait for the exclusive lock on deliveries, ms. */
  lockTimeoutMs?: number
}

/**
 * Makes the partitions due and drops the expired ones (keeping what attempt counts need), in one
 * transaction on a client of its own.
 */
export async function maintainAttemptPartitions(pool: pg.Pool, opts: MaintenanceOptions): Promise<MaintenanceResult> {
  const result: MaintenanceResult = { ran: false, created: [], dropped: [], droppedRows: 0, keptRows: 0 }
  // The first offsets kept, only when rows may be copied forward (something to drop or file).
  const due =
    (await listAttemptPartitions(pool)).some((p) => p.toMs <= opts.cutoffMs) ||
    (await pool.query(`SELECT 1 FROM ${DEFAULT_PARTITION} LIMIT 1`)).rows.length > 0
  const firsts = due ? await partitionStarts(pool) : []
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
      const all = await listAttemptPartitions(client)
      const doomed = all.filter((p) => p.toMs <= opts.cutoffMs)
      const kept = all.filter((p) => p.toMs > opts.cutoffMs)
      const created = partitionsToCreate(kept, opts.nowMs, opts.plan)
      const strays = await client.query(`SELECT 1 FROM ${DEFAULT_PARTITION} LIMIT 1`)
      if (doomed.length > 0 || created.length > 0 || strays.rows.length > 0) {
        // Counted before the exclusive lock: only rows of the past land in them (a test's later clock aside).
        for (const p of doomed) {
          const n = await client.query<{ n: number }>(`SELECT count(*)::float8 AS n FROM "${p.name}"`)
          result.droppedRows += n.rows[0]!.n
        }
        await client.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.round(opts.lockTimeoutMs ?? 2000))}`)
        await client.query('LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE')
        // Renamed as they are detached: a partition made below may take the name (a test's later clock drops the current one).
        for (const p of doomed) {
          await client.query(`ALTER TABLE deliveries DETACH PARTITION "${p.name}"`)
          await client.query(`ALTER TABLE "${p.name}" RENAME TO "${p.name}_gone"`)
        }
        // The default partition's rows out first: a partition is not made over rows the default holds.
        await client.query('CREATE TEMP TABLE hookq_strays (LIKE deliveries) ON COMMIT DROP')
        await client.query(`WITH d AS (DELETE FROM ${DEFAULT_PARTITION} RETURNING *) INSERT INTO hookq_strays SELECT * FROM d`)
        for (const p of created) {
          await client.query(
            `CREATE TABLE "${p.name}" PARTITION OF deliveries FOR VALUES FROM ('${new Date(p.fromMs).toISOString()}') TO ('${new Date(p.toMs).toISOString()}')
             WITH (fillfactor = 70)`,
          )
        }
        // Strays within the retention are filed now; the others are kept as a dropped partition's rows are.
        await client.query(
          `INSERT INTO deliveries (${COLUMNS}, filed_at) SELECT ${COLUMNS}, to_timestamp($1 / 1000.0) FROM hookq_strays WHERE filed_at > to_timestamp($2 / 1000.0)`,
          [opts.nowMs, opts.cutoffMs],
        )
        await client.query('DELETE FROM hookq_strays WHERE filed_at > to_timestamp($1 / 1000.0)', [opts.cutoffMs])
        const past = await client.query<{ n: number }>('SELECT count(*)::float8 AS n FROM hookq_strays')
        result.droppedRows += past.rows[0]!.n
        const copied = await client.query(copyForward([...doomed.map((p) => `${p.name}_gone`), 'hookq_strays']), [
          opts.nowMs,
          firsts.map((f) => f.topicId),
          firsts.map((f) => f.partition),
          firsts.map((f) => f.startOffset),
        ])
        result.keptRows = copied.rowCount ?? 0
        for (const p of doomed) await client.query(`DROP TABLE "${p.name}_gone"`)
        result.created = created.map((p) => p.name)
        result.dropped = doomed.map((p) => p.name)
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

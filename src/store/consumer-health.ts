/**
 * Storage of consumer health: successes and failures of pushes per consumer and 10-second bucket
 * (consumer_health), and each consumer's last success and last failure with its error (on its
 * consumers row). Written by every broker process about once a second; read by the group status.
 */
import { epochMsArray, numberArray } from './arrays.ts'
import type { Queryable } from './db.ts'
import { storableText } from './storable.ts'

/** What one process saw of one consumer in one bucket since its last write. */
export interface HealthCounts {
  consumerId: string
  /** The bucket's start, epoch ms (a multiple of HEALTH_BUCKET_MS). */
  bucketMs: number
  successes: number
  failures: number
  lastSuccessAt: Date | null
  lastFailureAt: Date | null
  lastError: string | null
}

/** A consumer's health as the status shows it. */
export interface ConsumerHealthView {
  lastSuccessAt: string | null
  lastFailureAt: string | null
  lastError: string | null
  /** Failed pushes / pushes over the last HEALTH_WINDOW_MS; null when there were none. */
  recentFailureRate: number | null
}

export const HEALTH_BUCKET_MS = 10_000
export const HEALTH_WINDOW_MS = 5 * 60_000

/**
 * Adds the counts (buckets of several processes add up), moves each consumer's last success and
 * failure forward (never back: processes write in any order), and deletes buckets past the window.
 * Consumers deleted meanwhile are skipped (the join), so a write never fails for them.
 */
export async function recordHealth(q: Queryable, rows: HealthCounts[]): Promise<void> {
  if (rows.length === 0) return
  const ids = rows.map((r) => r.consumerId)
  await q.query({
    name: 'hookq_health',
    text: `WITH input AS (
      SELECT u.* FROM unnest($1::text[], $2::float8[], $3::int[], $4::int[], $5::float8[], $6::float8[], $7::text[]) AS u(id, bucket, ok, bad, success_ms, failure_ms, error)
      JOIN consumers c ON c.id = u.id
    ), counted AS (
      INSERT INTO consumer_health (consumer_id, bucket, successes, failures)
      SELECT id, to_timestamp(bucket / 1000), ok, bad FROM input
      ON CONFLICT (consumer_id, bucket) DO UPDATE SET successes = consumer_health.successes + excluded.successes,
                                                      failures = consumer_health.failures + excluded.failures
    ), latest AS (
      UPDATE consumers c SET
        last_success_at = GREATEST(c.last_success_at, to_timestamp(i.success_ms / 1000)),
        last_error = CASE WHEN i.failure_ms IS NOT NULL AND (c.last_failure_at IS NULL OR to_timestamp(i.failure_ms / 1000) >= c.last_failure_at)
                          THEN i.error ELSE c.last_error END,
        last_failure_at = GREATEST(c.last_failure_at, to_timestamp(i.failure_ms / 1000))
      FROM (SELECT DISTINCT ON (id) id, success_ms, failure_ms, error FROM input ORDER BY id, bucket DESC) i
      WHERE c.id = i.id
    )
    DELETE FROM consumer_health WHERE consumer_id = ANY($1::text[]) AND bucket < now() - interval '${HEALTH_WINDOW_MS + 2 * HEALTH_BUCKET_MS} milliseconds'`,
    values: [
      ids,
      numberArray(rows.map((r) => r.bucketMs)),
      numberArray(rows.map((r) => r.successes)),
      numberArray(rows.map((r) => r.failures)),
      epochMsArray(rows.map((r) => r.lastSuccessAt)),
      epochMsArray(rows.map((r) => r.lastFailureAt)),
      rows.map((r) => storableText(r.lastError)),
    ],
  })
}

/**
 * Deletes buckets past the window of every consumer: recordHealth deletes those of the consumers it
 * writes for, but a consumer no longer pushed to keeps its last ones until this (the retention sweep).
 */
export async function deleteExpiredHealth(q: Queryable): Promise<number> {
  const res = await q.query(
    `DELETE FROM consumer_health WHERE bucket < now() - interval '${HEALTH_WINDOW_MS + 2 * HEALTH_BUCKET_MS} milliseconds'`,
  )
  return res.rowCount ?? 0
}

/** The health of each consumer named, by id (those never pushed to have all nulls). */
export async function readHealth(q: Queryable, consumerIds: string[], nowMs: number): Promise<Map<string, ConsumerHealthView>> {
  const out = new Map<string, ConsumerHealthView>()
  if (consumerIds.length === 0) return out
  const { rows } = await q.query<{
    id: string
    last_success_at: Date | null
    last_failure_at: Date | null
    last_error: string | null
    ok: number | null
    bad: number | null
  }>(
    `SELECT c.id, c.last_success_at, c.last_failure_at, c.last_error, h.ok, h.bad FROM consumers c
     LEFT JOIN (SELECT consumer_id, sum(successes)::int AS ok, sum(failures)::int AS bad FROM consumer_health
                WHERE consumer_id = ANY($1::text[]) AND bucket >= to_timestamp($2::float8 / 1000) GROUP BY consumer_id) h ON h.consumer_id = c.id
     WHERE c.id = ANY($1::text[])`,
    [consumerIds, nowMs - HEALTH_WINDOW_MS],
  )
  for (const r of rows) {
    const total = (r.ok ?? 0) + (r.bad ?? 0)
    out.set(r.id, {
      lastSuccessAt: r.last_success_at?.toISOString() ?? null,
      lastFailureAt: r.last_failure_at?.toISOString() ?? null,
      lastError: r.last_error,
      recentFailureRate: total === 0 ? null : (r.bad ?? 0) / total,
    })
  }
  return out
}

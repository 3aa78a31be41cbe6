/**
 * Vacuum where autovacuum does not run (autovacuum=off, or track_counts=off, or PGlite): the
 * retention sweep stands in for it. Without a vacuum a deleted row, and a row version an update left
 * behind that HOT pruning cannot take away (one whose index entries point at it), stays for ever:
 * its line pointer and index entries are never reused, and the table and its indexes grow with
 * traffic however few rows are live. Tables that take such writes as messages flow: group_completions
 * (a row per out-of-order completion, deleted once the committed offset passes it: measured ~25 dead
 * rows a second at 3,000 msg/s), consumer_health (buckets deleted as they age out),
 * produce_outbox (each row deleted as it moves), schedules and schedule_runners (updates of an
 * indexed column), broker_members. Not chosen here: the messages' default partitions,
 * messages_legacy and idempotency_keys, which the sweep deletes rows from itself and vacuums by its
 * own count of what it deleted (vacuumIfDue in src/store/messages.ts: no statistics to wait for);
 * and the attempt log's partitions, whose outcome updates are mostly HOT (fillfactor 70, pruned
 * without vacuum) and whose other dead rows go with the partition: a manual VACUUM of one, unlike
 * autovacuum, does not give way to the DROP of the partition's maintenance, which would wait for it
 * (their default partition, never dropped, is vacuumed). Nor any table not hookq's (VACUUMED_TABLES).
 */
import type { Queryable } from './db.ts'

/**
 * What to vacuum when the statistics are not kept (track_counts=off: n_dead_tup stays 0): the tables
 * above, every sweep. Small (their live rows are a few per partition, group or consumer), so a
 * vacuum of each costs a few pages.
 */
const WRITTEN_AS_MESSAGES_FLOW = [
  'group_completions',
  'group_offsets',
  'topic_partitions',
  'consumer_health',
  'consumers',
  'produce_outbox',
  'schedules',
  'schedule_runners',
  'broker_members',
]

/**
 * Every plain table of hookq's own that a vacuum may take (prisma/migrations), the others' parts
 * excepted (see above): a schema hookq shares with another application has tables this sweep must
 * leave to their owners. test/push/dead-rows.test.ts checks the list against a migrated database.
 */
export const VACUUMED_TABLES = [
  ...WRITTEN_AS_MESSAGES_FLOW,
  'api_key_version',
  'api_keys',
  'consumer_groups',
  'deliveries_default',
  'jwt_issuer',
  'jwt_keys',
  'produce_outbox_set_aside',
  'topics',
]

/**
 * hookq's tables (VACUUMED_TABLES) whose dead rows (pg_stat_user_tables.n_dead_tup) pass what
 * autovacuum waits for (the server's autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor ×
 * the rows the table holds: 50 + 20% by default), or, where the statistics are not kept, those of
 * WRITTEN_AS_MESSAGES_FLOW.
 */
const DUE = `
SELECT quote_ident(c.relname) AS name
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname = ANY($2::text[])
  AND CASE WHEN current_setting('track_counts')::bool
    THEN s.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float8
                        + current_setting('autovacuum_vacuum_scale_factor')::float8 * greatest(c.reltuples, 0)
    ELSE c.relname = ANY($1::text[]) END
ORDER BY c.relname`

/**
 * Vacuums every table due (see DUE), as autovacuum would at its next look; returns their names.
 * SKIP_LOCKED: a table another process is vacuuming (its sweep, or an autovacuum after all) is
 * passed by. TRUNCATE false: giving empty pages at the end back to the filesystem takes ACCESS
 * EXCLUSIVE on the table, which the progress writes' next INSERT into group_completions would
 * queue behind; the space vacuum frees is reused by the next rows all the same. Dead rows then stay below the threshold plus what the traffic makes between two
 * sweeps (docs/performance.md, "Dead rows where autovacuum is off").
 */
export async function vacuumDeadRows(q: Queryable): Promise<string[]> {
  const res = await q.query<{ name: string }>(DUE, [WRITTEN_AS_MESSAGES_FLOW, VACUUMED_TABLES])
  const names = res.rows.map((r) => r.name)
  if (names.length > 0) await q.query(`VACUUM (SKIP_LOCKED, TRUNCATE false) ${names.join(', ')}`)
  return names
}

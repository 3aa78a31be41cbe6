/**
 * What tests that send refused requests compare before and after: each table's row count and a
 * digest of its rows, read in one statement (one round trip and one consistent view for all the
 * tables; the fuzz and hostile-input files take one after each of thousands of requests).
 */

import { createHash } from 'node:crypto'

/** Something that runs a query: a node-postgres pool or client. */
interface Queryable {
  query(query: { name: string; text: string }): Promise<{ rows: Record<string, unknown>[] }>
}

/**
 * `sources`: table names, or [name, a subquery read in its place] where some columns are not
 * compared (the broker's own bookkeeping). Answers name → "<row count>:<md5 of the rows>".
 */
export function tableSnapshot(sources: (string | [name: string, from: string])[]): (db: Queryable) => Promise<Record<string, string>> {
  const named = sources.map((s) => (typeof s === 'string' ? [s, s] : s))
  const sql = `SELECT ${named
    .map(
      ([, from], i) =>
        `(SELECT count(*)::text || ':' || md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM ${from} x) AS t${i}`,
    )
    .join(', ')}`
  // A prepared statement: planned once per connection, not at every read. messages and deliveries
  // are partitioned (a partition or more per topic), and planning a read of every partition cost
  // several times the read itself once the fuzzing had made a few dozen topics.
  const name = `table_snapshot_${createHash('sha256').update(sql).digest('hex').slice(0, 16)}`
  return async (db) => {
    const { rows } = await db.query({ name, text: sql })
    return Object.fromEntries(named.map(([name], i) => [name, rows[0]![`t${i}`] as string]))
  }
}

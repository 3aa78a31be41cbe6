/**
 * What tests that send refused requests compare before and after: each table's row count and a
 * digest of its rows, read in one statement (one round trip and one consistent view for all the
 * tables; the fuzz and hostile-input files take one after each of thousands of requests).
 */

/** Something that runs a query: a node-postgres pool or client. */
interface Queryable {
  query(text: string): Promise<{ rows: Record<string, unknown>[] }>
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
  return async (db) => {
    const { rows } = await db.query(sql)
    return Object.fromEntries(named.map(([name], i) => [name, rows[0]![`t${i}`] as string]))
  }
}

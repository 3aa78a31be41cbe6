/**
 * The statements of a measured pass, from pg_stat_statements (BENCH_STATEMENTS=1): which statements
 * a change adds or saves, per message, without guessing from commit counts. The server must load
 * the extension (shared_preload_libraries=pg_stat_statements, then CREATE EXTENSION in the database
 * the bench connects to); without it the bench says so and goes on.
 */
import { withClient } from './db.ts'

export interface StatementRow {
  calls: number
  ms: number
  rows: number
  query: string
}

let unavailable = false

/** Forgets what the server counted so far (every database's): the pass's own statements come next. False (said once) without the extension. */
export async function resetStatements(serverUrl: string): Promise<boolean> {
  if (unavailable) return false
  return withClient(serverUrl, async (c) => {
    try {
      await c.query('SELECT pg_stat_statements_reset()')
      return true
    } catch (err) {
      unavailable = true
      console.log(`  pg_stat_statements unavailable on the server, no statements counted: ${(err as Error).message}`)
      return false
    }
  })
}

/** The statements run in database `name` since the reset, most time first. */
export async function statementsOf(serverUrl: string, name: string): Promise<StatementRow[]> {
  return withClient(serverUrl, async (c) => {
    const { rows } = await c.query<{ calls: string; ms: number; rows: string; query: string }>(
      `SELECT s.calls, s.total_exec_time AS ms, s.rows, regexp_replace(s.query, '\\s+', ' ', 'g') AS query
       FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
       WHERE d.datname = $1 ORDER BY s.total_exec_time DESC`,
      [name],
    )
    return rows.map((r) => ({ calls: Number(r.calls), ms: r.ms, rows: Number(r.rows), query: r.query }))
  })
}

/** The same statements of several databases (independent brokers) added up, most time first. */
export function mergeStatements(rows: StatementRow[]): StatementRow[] {
  const by = new Map<string, StatementRow>()
  for (const r of rows) {
    const m = by.get(r.query)
    if (m) {
      m.calls += r.calls
      m.ms += r.ms
      m.rows += r.rows
    } else by.set(r.query, { ...r })
  }
  return [...by.values()].sort((a, b) => b.ms - a.ms)
}

/** Prints the statements per 100,000 messages: calls, rows and time in the database. */
export function printStatements(rows: StatementRow[], messages: number, top = 12): void {
  const per = 100_000 / messages
  console.log(
    `  ${'statements per 100,000 messages:'.padEnd(36)}${'calls'.padStart(8)}  ${'rows'.padStart(8)}  ${'exec ms'.padStart(8)}  query`,
  )
  for (const r of rows.slice(0, top)) {
    console.log(
      `  ${''.padStart(36)}${Math.round(r.calls * per)
        .toString()
        .padStart(8)}  ${Math.round(r.rows * per)
        .toString()
        .padStart(8)}  ${Math.round(r.ms * per)
        .toString()
        .padStart(8)}  ${r.query.slice(0, 90)}`,
    )
  }
  const total = rows.reduce((a, r) => ({ calls: a.calls + r.calls, ms: a.ms + r.ms }), { calls: 0, ms: 0 })
  console.log(
    `  ${'all'.padStart(36)}${Math.round(total.calls * per)
      .toString()
      .padStart(8)}  ${''.padStart(8)}  ${Math.round(total.ms * per)
      .toString()
      .padStart(8)}`,
  )
}

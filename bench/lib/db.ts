/** A throw-away database on the local PostgreSQL server for one bench run. */
import { randomBytes } from 'node:crypto'
import pg from 'pg'
import { countPostgresOf } from './proc.ts'

export interface BenchDatabase {
  name: string
  url: string
  drop(): Promise<void>
}

/** Creates hookq_bench_<random> on the server of `serverUrl`; drop() is safe to call twice. */
export async function createBenchDatabase(serverUrl: string): Promise<BenchDatabase> {
  const name = `hookq_bench_${randomBytes(4).toString('hex')}`
  // The CPU accounting counts this server's processes only (see countPostgresOf).
  countPostgresOf(await adminQuery(serverUrl, `CREATE DATABASE ${name}`))
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  let dropped = false
  return {
    name,
    url: url.toString(),
    async drop() {
      if (dropped) return
      dropped = true
      // FORCE ends connections still open (a broker killed mid-run leaves none, but a hung one might).
      await adminQuery(serverUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    },
  }
}

/** Reads a few server settings that decide commit cost, to print next to the figures. */
export function serverSettings(serverUrl: string): Promise<Record<string, string>> {
  return withClient(serverUrl, async (client) => {
    const { rows } = await client.query<{ name: string; setting: string }>(
      `SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'wal_sync_method', 'commit_delay', 'max_connections')`,
    )
    return Object.fromEntries(rows.map((r) => [r.name, r.setting]))
  })
}

/** Runs `sql` on a connection of its own; returns that session's backend pid. */
function adminQuery(serverUrl: string, sql: string): Promise<number> {
  return withClient(serverUrl, async (client) => {
    await client.query(sql)
    // The BackendKeyData pid pg keeps for cancelling (not in its typings): no query needed.
    return (client as unknown as { processID: number }).processID
  })
}

/** Runs `f` on a connection of its own to `url`, closed afterwards. */
export async function withClient<T>(url: string, f: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await f(client)
  } finally {
    await client.end()
  }
}

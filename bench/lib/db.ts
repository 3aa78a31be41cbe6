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
  await adminQuery(serverUrl, `CREATE DATABASE ${name}`)
  await serverSettings(serverUrl) // counts this server's processes only (see countPostgresOf)
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

/**
 * Reads a few server settings that decide commit cost, to print next to the figures, and tells the
 * CPU accounting which server's processes to count (the one at `serverUrl`, when it runs here).
 */
export async function serverSettings(serverUrl: string): Promise<Record<string, string>> {
  const client = new pg.Client({ connectionString: serverUrl })
  await client.connect()
  try {
    const backend = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
    countPostgresOf(backend.rows[0]!.pid)
    const { rows } = await client.query<{ name: string; setting: string }>(
      `SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'wal_sync_method', 'commit_delay', 'max_connections')`,
    )
    return Object.fromEntries(rows.map((r) => [r.name, r.setting]))
  } finally {
    await client.end()
  }
}

async function adminQuery(serverUrl: string, sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: serverUrl })
  await client.connect()
  try {
    await client.query(sql)
  } finally {
    await client.end()
  }
}

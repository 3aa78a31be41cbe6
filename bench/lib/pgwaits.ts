/**
 * Samples what the bench database's backends are doing (pg_stat_activity) while a scenario runs,
 * to tell apart the possible limits: "in tx: ClientRead" = a transaction waiting for the broker's
 * next statement (broker or round-trip latency), "Lock:*" = waiting for another transaction's
 * partition row locks, "IO:WAL*" / "LWLock:WAL*" = commit flushes, "active" = running on the CPU.
 */
import pg from 'pg'

const SAMPLE = `
SELECT CASE
  WHEN state = 'idle' THEN 'idle'
  WHEN state LIKE 'idle in transaction%' THEN 'in tx: ' || coalesce(wait_event, 'between statements')
  ELSE coalesce(wait_event_type || ':' || wait_event, 'active (CPU)')
END AS what, count(*)::int AS n
FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
GROUP BY 1`

export interface WaitSampler {
  /** Average number of backends in each state over the samples, most frequent first. */
  stop(): Promise<{ samples: number; avg: [string, number][] }>
}

/** Samples every `intervalMs` until stop(), at most `maxSamples` times. */
export async function sampleWaits(url: string, dbName: string, intervalMs = 50, maxSamples = 10_000): Promise<WaitSampler> {
  const client = new pg.Client({ connectionString: url, application_name: 'hookq-bench-waits' })
  await client.connect()
  const totals = new Map<string, number>()
  let samples = 0
  let running = true
  const loop = (async () => {
    while (running && samples < maxSamples) {
      const { rows } = await client.query<{ what: string; n: number }>(SAMPLE, [dbName])
      for (const r of rows) totals.set(r.what, (totals.get(r.what) ?? 0) + r.n)
      samples++
      await new Promise((resolve) => setTimeout(resolve, intervalMs))
    }
  })().catch(() => {
    /* connection ended (database dropped on Ctrl-C): keep what was sampled */
  })
  return {
    async stop() {
      running = false
      await loop.finally(() => client.end())
      const avg = [...totals].map(([what, n]): [string, number] => [what, n / Math.max(1, samples)]).sort((a, b) => b[1] - a[1])
      return { samples, avg }
    },
  }
}

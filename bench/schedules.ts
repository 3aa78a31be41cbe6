/**
 * What schedules cost (`npm run bench:schedules`): one broker on a fresh database, BENCH_SCHEDULES
 * schedules `every: 1000` on one topic, then over BENCH_SECONDS:
 *   - ticks made, and the broker's and PostgreSQL's CPU per tick (from /proc);
 *   - lateness: each message's produce time (its `timestamp`, when the outbox mover appended it)
 *     minus its `hookq-schedule-tick`, p50, p99 and max.
 * HOOKQ_PROCESSES=2 runs two processes ticking together (their CPU is then not counted as the broker's).
 *
 * Environment (all optional): BENCH_SCHEDULES=1000  BENCH_SECONDS=30
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { brokerApi, startBroker } from './lib/broker.ts'
import { createBenchDatabase, withClient } from './lib/db.ts'
import { envCount, envInt, SERVER_URL } from './lib/env.ts'
import { countPostgresDatabases, cpuSince, cpuSnapshot } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { quantile } from './lib/stats.ts'

const SCHEDULES = envCount('BENCH_SCHEDULES', 1000)
const SECONDS = envInt('BENCH_SECONDS', 30)
const PROCESSES = Number(process.env.HOOKQ_PROCESSES || 1)

cleanUpOnInterrupt('the broker')
await runBench(async () => {
  run.db = await createBenchDatabase(SERVER_URL)
  countPostgresDatabases([run.db.name])
  const broker = (run.broker = await startBroker(run.db.url, { timeoutMs: 120_000 }))
  const api = (method: string, path: string, body?: unknown) => brokerApi(broker.url, method, path, body)
  await api('PUT', '/v1/topics/ticks', { partitions: 4 })
  let next = 0
  const creator = async () => {
    for (let i = next++; i < SCHEDULES; i = next++) {
      await api('PUT', `/v1/schedules/s${i}`, { topic: 'ticks', every: 1000, message: { value: i } })
    }
  }
  await Promise.all([creator(), creator(), creator(), creator()])
  await sleep(3000) // the first ticks settle

  const count = () =>
    withClient(run.db!.url, async (c) => Number((await c.query<{ n: string }>('SELECT count(*) AS n FROM messages')).rows[0]!.n))
  const before = await count()
  const fromMs = Date.now()
  // With HOOKQ_PROCESSES the broker's pid is the primary's: its workers' CPU is not in brokerPct.
  const start = cpuSnapshot(broker.pid)
  await sleep(SECONDS * 1000)
  const cpu = cpuSince(start, broker.pid)
  const ticks = (await count()) - before
  const late = await withClient(run.db!.url, async (c) =>
    (
      await c.query<{ ms: number }>(
        `SELECT (extract(epoch FROM produced_at - (headers::json->>'hookq-schedule-tick')::timestamptz) * 1000)::float8 AS ms
         FROM messages WHERE produced_at >= to_timestamp($1::float8 / 1000) ORDER BY 1`,
        [fromMs],
      )
    ).rows.map((r) => r.ms),
  )
  const at = (p: number) => quantile(late, p).toFixed(0)
  const perTickUs = (pct: number) => ((pct * 10_000 * cpu.seconds) / Math.max(1, ticks)).toFixed(0)
  console.log(
    `${SCHEDULES} schedules every 1 s, ${PROCESSES} process(es), ${cpu.seconds.toFixed(1)} s: ${ticks} ticks (${(ticks / cpu.seconds).toFixed(0)}/s); ` +
      `CPU per tick: broker ${PROCESSES > 1 ? 'n/a (workers)' : `${perTickUs(cpu.brokerPct)} us`}, PostgreSQL ${perTickUs(cpu.postgresPct)} us ` +
      `(broker ${cpu.brokerPct.toFixed(1)}%, PostgreSQL ${cpu.postgresPct.toFixed(1)}% of a core; host ${cpu.hostPct.toFixed(0)}% busy)`,
  )
  console.log(`lateness (produced - tick) of ${late.length} ticks: p50 ${at(50)} ms, p99 ${at(99)} ms, max ${at(100)} ms`)
})

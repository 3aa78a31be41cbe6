/**
 * Does the database stop growing under steady traffic once the retentions have passed? (issue 34)
 *
 * One broker on a throw-away database; a topic with retentionMs BENCH_RETENTION_MS (60 s) and an
 * auto-mode group pushing to a receiver that answers 200; HOOKQ_ATTEMPT_RETENTION_MS the same, sweeps
 * every 5 s (unless HOOKQ_RETENTION_INTERVAL_MS says otherwise). Produces BENCH_RATE msg/s (1000) for
 * BENCH_SECONDS (240), in batches every 50 ms, and prints every 15 s, for messages, deliveries,
 * idempotency_keys and group_completions (a partitioned table summed over its partitions): size with
 * indexes, live and dead tuples, vacuums; the database's size; the age of the oldest snapshot any
 * session holds (one held long keeps vacuum from removing dead rows); the CPU per message pushed since
 * the last line of the broker and of the bench database's backends; every other table's dead rows and
 * HOT updates. It ends with the most dead rows each table had at a report. BENCH_VACUUM_MS=<ms>: the
 * bench runs VACUUM on messages and deliveries that often, standing in for autovacuum where it is off.
 *
 *   npm run bench:retention   # the issue's compressed week: BENCH_SECONDS=1200 BENCH_RATE=3000
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { brokerApi, serve, startBroker } from './lib/broker.ts'
import { createBenchDatabase, withClient } from './lib/db.ts'
import { envCount, envInt, SERVER_URL } from './lib/env.ts'
import { processCpuSeconds } from './lib/proc.ts'
import { atCleanup, cleanUpOnInterrupt, run, runBench } from './lib/run.ts'

const rate = envInt('BENCH_RATE', 1000)
const seconds = envInt('BENCH_SECONDS', 240)
const retentionMs = envInt('BENCH_RETENTION_MS', 60_000)
const vacuumMs = envCount('BENCH_VACUUM_MS', 0)
const tickMs = 50
const perTick = Math.max(1, Math.round((rate * tickMs) / 1000))

let pushes = 0
let vacuuming: Promise<unknown> | undefined
cleanUpOnInterrupt('the broker')

const SIZES = `
SELECT c.relname AS table, sum(pg_total_relation_size(r.oid)) AS bytes, sum(s.n_live_tup) AS live, sum(s.n_dead_tup) AS dead,
       sum(s.autovacuum_count + s.vacuum_count) AS vacuums, count(*) FILTER (WHERE r.oid <> c.oid) AS parts
FROM pg_class c
CROSS JOIN LATERAL (SELECT c.oid UNION SELECT p.relid FROM pg_partition_tree(c.oid) p) r(oid)
LEFT JOIN pg_stat_user_tables s ON s.relid = r.oid
WHERE c.relname IN ('messages', 'deliveries', 'idempotency_keys', 'group_completions') AND c.relkind IN ('r', 'p')
GROUP BY c.relname ORDER BY c.relname`

// Every other table of the schema (not a part of messages or deliveries): dead rows, updates and HOT updates.
const OTHERS = `
SELECT s.relname AS table, s.n_dead_tup AS dead, s.n_tup_upd AS upd, s.n_tup_hot_upd AS hot
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND NOT c.relispartition
  AND s.relname NOT IN ('messages', 'deliveries', 'idempotency_keys', 'group_completions', '_prisma_migrations')
ORDER BY s.relname`
/** The most dead rows seen at a report, per table (SIZES' and OTHERS'), printed at the end. */
const maxDead = new Map<string, number>()

/** CPU seconds (user + system) of a process, 0 once it is gone. */
const cpuSeconds = (pid: number) => processCpuSeconds(pid) ?? 0
const backendCpu = new Map<number, number>()
let lastCpu = { broker: 0, pg: 0, pushes: 0 }

async function report(db: { url: string }, brokerPid: number, elapsedS: number, produced: number): Promise<void> {
  await withClient(db.url, async (client) => {
    // The parents locked first, as src/store/storage.ts does: reading partition sizes one by one must
    // not hold a partition the attempt log's maintenance waits for while it holds the parent.
    await client.query('BEGIN')
    await client.query('LOCK TABLE deliveries, messages IN ACCESS SHARE MODE')
    const { rows } = await client.query<{ table: string; bytes: string; live: string; dead: string; vacuums: string; parts: string }>(SIZES)
    await client.query('COMMIT')
    const others = await client.query<{ table: string; dead: string; upd: string; hot: string }>(OTHERS)
    for (const r of others.rows) maxDead.set(r.table, Math.max(maxDead.get(r.table) ?? 0, Number(r.dead)))
    const backends = await client.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE datname = current_database()')
    for (const { pid } of backends.rows) backendCpu.set(pid, Math.max(backendCpu.get(pid) ?? 0, cpuSeconds(pid)))
    const cpu = { broker: cpuSeconds(brokerPid), pg: [...backendCpu.values()].reduce((a, b) => a + b, 0), pushes }
    const n = cpu.pushes - lastCpu.pushes
    const perMsg = (now: number, before: number) => (n > 0 ? (((now - before) * 1e6) / n).toFixed(0) : '-')
    const cpuCell = `cpu µs/msg broker ${perMsg(cpu.broker, lastCpu.broker)} pg ${perMsg(cpu.pg, lastCpu.pg)}`
    lastCpu = cpu
    const total = await client.query<{ bytes: string; xmin_s: number | null }>(
      `SELECT pg_database_size(current_database()) AS bytes,
              (SELECT extract(epoch FROM clock_timestamp() - min(xact_start))::float8 FROM pg_stat_activity WHERE backend_xmin IS NOT NULL) AS xmin_s`,
    )
    const mb = (b: string | number) => (Number(b) / 1048576).toFixed(1)
    const cells = rows.map(
      (r) =>
        `${r.table} ${mb(r.bytes)} MB${Number(r.parts) > 0 ? ` (${r.parts} parts)` : ''} live ${r.live} dead ${r.dead} vacuums ${r.vacuums}`,
    )
    for (const r of rows) maxDead.set(r.table, Math.max(maxDead.get(r.table) ?? 0, Number(r.dead)))
    const { bytes, xmin_s } = total.rows[0]!
    // The other tables with dead rows now, and how many of their updates were HOT (pruned without vacuum).
    const otherCells = others.rows
      .filter((r) => Number(r.dead) > 0 || Number(r.upd) > 0)
      .map((r) => `${r.table} dead ${r.dead}${Number(r.upd) > 0 ? ` hot ${r.hot}/${r.upd}` : ''}`)
    console.log(
      `t=${String(elapsedS).padStart(3)}s produced ${produced} pushed ${pushes} | ${cells.join(' | ')} | database ${mb(bytes)} MB | oldest snapshot ${Math.round(xmin_s ?? 0)} s | ${cpuCell} | others: ${otherCells.join(', ') || 'no dead rows'}`,
    )
  })
}

await runBench(async () => {
  const receiver = await serve(() => {
    pushes++
    return undefined
  })
  atCleanup(async () => receiver.close())
  const db = (run.db = await createBenchDatabase(SERVER_URL))
  const broker = (run.broker = await startBroker(db.url, {
    timeoutMs: 120_000,
    env: {
      HOOKQ_ATTEMPT_RETENTION_MS: String(retentionMs),
      HOOKQ_RETENTION_INTERVAL_MS: process.env.HOOKQ_RETENTION_INTERVAL_MS || '5000',
      HOOKQ_PUSH_ALLOW_PRIVATE: 'true',
      HOOKQ_PUSH_ALLOW_HTTP: 'true',
    },
  }))
  await brokerApi(broker.url, 'PUT', '/v1/topics/bench', { partitions: 4, retentionMs })
  await brokerApi(broker.url, 'PUT', '/v1/groups/bench', { topic: 'bench', ackMode: 'auto', maxInFlight: 1000 })
  await brokerApi(broker.url, 'POST', '/v1/groups/bench/consumers', { url: `${receiver.url}/hook` })
  const body = JSON.stringify({ messages: Array.from({ length: perTick }, (_, i) => ({ value: { i, pad: 'x'.repeat(200) } })) })
  const MAX_OUTSTANDING = 8
  const outstanding = new Set<Promise<void>>()
  let skipped = 0
  const produceOnce = async () => {
    const res = await fetch(`${broker.url}/v1/topics/bench/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
      signal: AbortSignal.timeout(30_000),
    })
    await res.arrayBuffer()
    if (res.status === 201) produced += perTick
  }
  const start = performance.now()
  let produced = 0
  let nextReport = 0
  let nextVacuum = vacuumMs / 1000
  for (let tick = 0; performance.now() - start < seconds * 1000 && tick < (seconds * 1000) / tickMs + 10; tick++) {
    const due = start + tick * tickMs
    const wait = due - performance.now()
    if (wait > 0) await sleep(wait)
    // Open loop at a steady rate: a call slower than a tick does not hold up the next ones (up to
    // MAX_OUTSTANDING at once; past that the tick's messages are not sent, and counted as skipped),
    // and a slow spell is not made up for by a burst that would inflate the live rows.
    if (outstanding.size < MAX_OUTSTANDING) {
      const call = produceOnce().finally(() => outstanding.delete(call))
      outstanding.add(call)
    } else {
      skipped += perTick
    }
    const elapsed = (performance.now() - start) / 1000
    if (vacuumMs > 0 && elapsed >= nextVacuum) {
      nextVacuum += vacuumMs / 1000
      // Not awaited: it runs beside the load, as autovacuum would (one at a time).
      if (!vacuuming) {
        vacuuming = withClient(db.url, (client) => client.query('VACUUM messages, deliveries'))
          .catch((err: unknown) => console.error('VACUUM failed:', err))
          .finally(() => {
            vacuuming = undefined
          })
      }
    }
    if (elapsed >= nextReport) {
      await report(db, broker.pid, Math.round(elapsed), produced)
      nextReport += 15
    }
  }
  await Promise.all(outstanding)
  await vacuuming
  console.log(`skipped ${skipped} messages (${MAX_OUTSTANDING} produce calls already outstanding at their tick)`)
  await report(db, broker.pid, Math.round((performance.now() - start) / 1000), produced)
  console.log(`most dead rows at any report: ${[...maxDead].map(([t, n]) => `${t} ${n}`).join(', ')}`)
})

/**
 * Produce throughput and latency of hookq against the local PostgreSQL (`npm run bench:produce`).
 *
 * A fresh database, the broker as a child process on it, load from separate processes (autocannon
 * in bench/load-worker.ts) at 1, 16 and 64 connections with batches of 1 and 100 messages, and a
 * baseline of plain single-row INSERT autocommits (bench/baseline-worker.ts). Prints figures next
 * to the goals; exits non-zero only when the run itself fails, never for a missed goal.
 *
 * Environment (all optional):
 *   BENCH_SECONDS=5            measured seconds per scenario (after the warm-up)
 *   BENCH_WARMUP_SECONDS=2     warm-up seconds per scenario, not counted
 *   BENCH_SCENARIOS=...        connections x batch list, default 1x1,16x1,64x1,1x100,16x100,64x100
 *   BENCH_PARTITIONS=8         partitions of the topic
 *   BENCH_BASELINE=0           skip the INSERT baseline
 *   BENCH_PG_WAITS=0           do not sample pg_stat_activity wait events during each scenario
 *   BENCH_CPU_PROF=1           run the broker with --cpu-prof into bench/out and print its top self time
 *   BENCH_SQL_SCENARIOS=16x1,16x100  transactional produce: connections x messages per transaction
 *                              (hookq_produce in the load's own transactions; empty: skip), each followed
 *                              by the time the broker takes to move what is left in the outbox
 *   BENCH_SQL_LATENCY_RATE=200  transactions/s (one message each) of the commit-to-push scenario (0: skip)
 *   BENCH_DATABASE_URL=...     server to create the bench database on (default postgres@127.0.0.1:5432)
 *   HOOKQ_*                    passed to the broker (e.g. HOOKQ_COMMIT_CONCURRENCY=4)
 */
import { readdirSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { startBroker, stopBroker } from './lib/broker.ts'
import { ROOT, runJsonWorker } from './lib/child.ts'
import { formatSummary, summarizeProfile } from './lib/cpuprofile.ts'
import { sampleWaits, type WaitSampler } from './lib/pgwaits.ts'
import { cpuSince, cpuSnapshot } from './lib/proc.ts'
import { createBenchDatabase, serverSettings } from './lib/db.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { Latencies, type Measured } from './lib/stats.ts'
import pg from 'pg'
import { envNumber } from './lib/env.ts'

const MEASURE_S = envNumber('BENCH_SECONDS', 5)
const WARMUP_S = envNumber('BENCH_WARMUP_SECONDS', 2)
const PARTITIONS = envNumber('BENCH_PARTITIONS', 8)
const MAX_REQUESTS = envNumber('BENCH_MAX_REQUESTS', 1_000_000) // per scenario: bounded in count too
const BASELINE = process.env.BENCH_BASELINE !== '0'
const PG_WAITS = process.env.BENCH_PG_WAITS !== '0'
const CPU_PROF_DIR = process.env.BENCH_CPU_PROF === '1' ? 'bench/out' : undefined
const SERVER_URL = process.env.BENCH_DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
const SCENARIOS = (process.env.BENCH_SCENARIOS || '1x1,16x1,64x1,1x100,16x100,64x100').split(',').map((s) => {
  const m = /^\s*(\d+)x(\d+)\s*$/.exec(s)
  if (!m) throw new Error(`BENCH_SCENARIOS: "${s}" is not <connections>x<batch>`)
  return { connections: Number(m[1]), batch: Number(m[2]) }
})
const SQL_SCENARIOS = (process.env.BENCH_SQL_SCENARIOS ?? '16x1,16x100')
  .split(',')
  .filter((s) => s.trim() !== '')
  .map((s) => {
    const m = /^\s*(\d+)x(\d+)\s*$/.exec(s)
    if (!m) throw new Error(`BENCH_SQL_SCENARIOS: "${s}" is not <connections>x<batch>`)
    return { connections: Number(m[1]), batch: Number(m[2]) }
  })
const SQL_LATENCY_RATE = process.env.BENCH_SQL_LATENCY_RATE === '0' ? 0 : envNumber('BENCH_SQL_LATENCY_RATE', 200)
const TOPIC = 'bench'
const GOALS = { singleMsgPerS: 15_000, vsBaseline: 1.2, singleP99Ms: 10, batchMsgPerS: 100_000 }

interface Row {
  label: string
  connections: number
  batch: number
  m: Measured
}

// ---- cleanup: the bench database and the processes this run started, also on failure and Ctrl-C

cleanUpOnInterrupt('the load and the broker')

// ---- formatting

const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '-')
const fixed = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : '-')
const codes = (m: Measured) =>
  Object.entries(m.non201)
    .map(([code, n]) => `${code}:${n}`)
    .join(' ') || '0'
// Host CPU not used by the broker, PostgreSQL or the load worker: other tenants of the machine.
const otherPct = (m: Measured) =>
  m.cpu.hostPct * m.cpu.cores - (Number.isFinite(m.cpu.brokerPct) ? m.cpu.brokerPct : 0) - m.cpu.postgresPct - m.cpu.selfPct
const perS = (m: Measured) => ({ items: m.items / m.cpu.seconds, ops: m.ok / m.cpu.seconds })

function table(rows: Row[]): string {
  const head = [
    'scenario',
    'msg/s',
    'req/s',
    'p50 ms',
    'p99 ms',
    'broker CPU%',
    'pg CPU%',
    'loadgen CPU%',
    'other CPU%',
    'non-201',
    'errors',
  ]
  const body = rows.map(({ label, m }) => {
    const r = perS(m)
    return [
      label,
      int(r.items),
      int(r.ops),
      fixed(m.latencyMs.p50, 2),
      fixed(m.latencyMs.p99, 2),
      fixed(m.cpu.brokerPct, 0),
      fixed(m.cpu.postgresPct, 0),
      fixed(m.cpu.selfPct, 0),
      fixed(otherPct(m), 0),
      codes(m),
      String(m.errors),
    ]
  })
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n')
}

function goals(rows: Row[], baseline: Measured | undefined): string {
  const find = (c: number, b: number) => rows.find((r) => r.connections === c && r.batch === b)?.m
  const single = find(64, 1)
  const batch = find(64, 100)
  const ratio = single && baseline ? perS(single).items / perS(baseline).items : NaN
  const lines: [string, string, string, boolean | undefined][] = [
    [
      'single message, 64 clients: msg/s',
      single ? int(perS(single).items) : 'not run',
      `>= ${int(GOALS.singleMsgPerS)}`,
      single && perS(single).items >= GOALS.singleMsgPerS,
    ],
    [
      'single message, 64 clients / INSERT baseline',
      Number.isFinite(ratio) ? `${ratio.toFixed(2)}x` : 'not run',
      `>= ${GOALS.vsBaseline}x`,
      Number.isFinite(ratio) ? ratio >= GOALS.vsBaseline : undefined,
    ],
    [
      'single message, 64 clients: p99',
      single ? `${fixed(single.latencyMs.p99, 2)} ms` : 'not run',
      `<= ${GOALS.singleP99Ms} ms`,
      single && single.latencyMs.p99 <= GOALS.singleP99Ms,
    ],
    [
      'batches of 100, 64 clients: msg/s',
      batch ? int(perS(batch).items) : 'not run',
      `>= ${int(GOALS.batchMsgPerS)}`,
      batch && perS(batch).items >= GOALS.batchMsgPerS,
    ],
  ]
  const w0 = Math.max(...lines.map((l) => l[0].length))
  const w1 = Math.max(...lines.map((l) => l[1].length))
  return [
    'goals:',
    ...lines.map(
      ([what, got, goal, met]) =>
        `  ${what.padEnd(w0)}  ${got.padStart(w1)}   goal ${goal.padEnd(10)}  ${met === undefined ? '' : met ? 'met' : 'MISSED'}`,
    ),
  ].join('\n')
}

// ---- transactional produce

/** Seconds until the produce outbox is empty (the broker has moved every committed row), at most 120. */
async function outboxDrained(databaseUrl: string): Promise<number> {
  const c = new pg.Client({ connectionString: databaseUrl })
  await c.connect()
  try {
    const t0 = performance.now()
    while (performance.now() - t0 < 120_000) {
      if ((await c.query('SELECT 1 FROM produce_outbox LIMIT 1')).rowCount === 0) return (performance.now() - t0) / 1000
      await sleep(10)
    }
    return NaN
  } finally {
    await c.end()
  }
}

/**
 * From COMMIT returning to the push arriving: one-message transactions at `rate` a second for
 * `seconds`, to a group in auto mode whose consumer is a node:http server in this process (one
 * clock for both ends). Includes the broker's outbox poll (HOOKQ_OUTBOX_POLL_MS).
 */
async function commitToPush(
  brokerUrl: string,
  databaseUrl: string,
  rate: number,
  seconds: number,
): Promise<{ n: number; p50: number; p99: number; max: number }> {
  const topic = 'bench-sql-latency'
  const committedAt = new Map<number, number>()
  const delays = new Latencies()
  const server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (d) => {
      body += d
    })
    req.on('end', () => {
      const id = (JSON.parse(body) as { value: { id: number } }).value.id
      const at = committedAt.get(id)
      if (at !== undefined) delays.add(performance.now() - at)
      res.end('ok')
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const c = new pg.Client({ connectionString: databaseUrl })
  await c.connect()
  try {
    const api = (method: string, path: string, body: unknown) =>
      fetch(`${brokerUrl}${path}`, { method, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
    await api('PUT', `/v1/topics/${topic}`, { partitions: PARTITIONS })
    await api('PUT', `/v1/groups/${topic}`, { topic, ackMode: 'auto' })
    await api('POST', `/v1/groups/${topic}/consumers`, { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` })
    const total = Math.round(rate * seconds)
    const t0 = performance.now()
    for (let id = 0; id < total; id++) {
      const due = t0 + (id * 1000) / rate
      const now = performance.now()
      if (due > now) await sleep(due - now)
      await c.query('BEGIN')
      await c.query('SELECT hookq_produce($1, $2)', [topic, JSON.stringify({ id })])
      await c.query('COMMIT')
      committedAt.set(id, performance.now())
    }
    const deadline = performance.now() + 30_000
    while (delays.count < total && performance.now() < deadline) await sleep(20)
    return { n: delays.count, ...delays.summary() }
  } finally {
    await c.end()
    await new Promise((resolve) => server.close(resolve))
  }
}

// ---- the run

async function main(): Promise<void> {
  const settings = await serverSettings(SERVER_URL)
  // First: it also tells the CPU accounting which server is ours (countPostgresOf).
  const db = (run.db = await createBenchDatabase(SERVER_URL))
  // The machine is shared: say how busy it was before we added any load.
  const idle = cpuSnapshot(undefined)
  await sleep(1000)
  const background = cpuSince(idle, undefined)
  const started = Date.now()
  const broker = (run.broker = await startBroker(db.url, { timeoutMs: 90_000, ...(CPU_PROF_DIR ? { cpuProfDir: CPU_PROF_DIR } : {}) }))

  const put = await fetch(`${broker.url}/v1/topics/${TOPIC}`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ partitions: PARTITIONS }),
  })
  if (put.status !== 201) throw new Error(`creating topic ${TOPIC}: HTTP ${put.status} ${await put.text()}`)

  const brokerEnv = Object.entries(process.env)
    .filter(([k]) => k.startsWith('HOOKQ_'))
    .map(([k, v]) => `${k}=${v}`)
  console.log(
    `hookq produce bench: database ${db.name}, topic ${TOPIC} with ${PARTITIONS} partitions, ` +
      `${WARMUP_S} s warm-up + ${MEASURE_S} s measured per scenario`,
  )
  console.log(
    `broker pid ${broker.pid} at ${broker.url}; ${brokerEnv.length ? brokerEnv.join(' ') : 'no HOOKQ_* settings (broker defaults)'}` +
      `${CPU_PROF_DIR ? `; --cpu-prof into ${CPU_PROF_DIR}` : ''}`,
  )
  console.log(
    `PostgreSQL ${settings.server_version}: fsync=${settings.fsync} synchronous_commit=${settings.synchronous_commit} ` +
      `wal_sync_method=${settings.wal_sync_method} commit_delay=${settings.commit_delay}`,
  )
  console.log(
    `host: ${cpus().length} cores, ${fixed(background.hostPct * background.cores, 0)}% of one core busy before the run ` +
      `(postgres ${fixed(background.postgresPct, 0)}%)\n`,
  )

  const workerTimeoutMs = (WARMUP_S + MEASURE_S + 60) * 1000
  let baseline: Measured | undefined
  if (BASELINE) {
    // While the broker idles: the same server, disk and row shape, without HTTP or group commit.
    baseline = await runJsonWorker<Measured>(
      'bench/baseline-worker.ts',
      { databaseUrl: db.url, poolSize: 8, concurrency: 64, warmupS: WARMUP_S, measureS: MEASURE_S, maxRows: MAX_REQUESTS },
      workerTimeoutMs,
    )
    console.log(`baseline: ${int(perS(baseline).items)} rows/s, p99 ${fixed(baseline.latencyMs.p99, 2)} ms, errors ${baseline.errors}`)
  }

  const rows: Row[] = []
  for (const { connections, batch } of SCENARIOS) {
    const worker = runJsonWorker<Measured>(
      'bench/load-worker.ts',
      {
        url: `${broker.url}/v1/topics/${TOPIC}/messages`,
        connections,
        batch,
        warmupS: WARMUP_S,
        measureS: MEASURE_S,
        maxRequests: MAX_REQUESTS,
        brokerPid: broker.pid,
      },
      workerTimeoutMs,
    )
    // Sample backend states over the measured part only (roughly: from the end of the warm-up).
    // Diagnostics only: a sampler that fails must not fail the run.
    let sampler: Promise<WaitSampler | undefined> = Promise.resolve(undefined)
    const waitTimer = PG_WAITS
      ? setTimeout(() => {
          sampler = sampleWaits(SERVER_URL, run.db!.name).catch(() => undefined)
        }, WARMUP_S * 1000)
      : undefined
    const m = await worker.finally(() => clearTimeout(waitTimer))
    const waited = await (await sampler)?.stop().catch(() => undefined)
    if (broker.child.exitCode !== null || broker.child.signalCode !== null) {
      throw new Error(`the broker died during ${connections}x${batch}:\n${broker.output()}`)
    }
    const label = `${connections} conn x ${batch} msg`
    rows.push({ label, connections, batch, m })
    console.log(`${label}: ${int(perS(m).items)} msg/s, p99 ${fixed(m.latencyMs.p99, 2)} ms, non-201 ${codes(m)}, errors ${m.errors}`)
    if (waited) {
      console.log(
        `  pg backends, average count by state (${waited.samples} samples): ` +
          waited.avg
            .filter(([, n]) => n >= 0.05)
            .map(([what, n]) => `${what} ${n.toFixed(2)}`)
            .join(', '),
      )
    }
  }

  for (const { connections, batch } of SQL_SCENARIOS) {
    const m = await runJsonWorker<Measured>(
      'bench/sql-produce-worker.ts',
      {
        databaseUrl: db.url,
        topic: TOPIC,
        connections,
        batch,
        warmupS: WARMUP_S,
        measureS: MEASURE_S,
        maxRows: MAX_REQUESTS,
        brokerPid: broker.pid,
      },
      workerTimeoutMs,
    )
    const drainS = await outboxDrained(db.url)
    const label = `SQL ${connections} conn x ${batch} msg/tx`
    rows.push({ label, connections, batch, m })
    console.log(
      `${label}: ${int(perS(m).items)} msg/s committed, p99 ${fixed(m.latencyMs.p99, 2)} ms per transaction, errors ${m.errors}; ` +
        `the outbox was empty ${fixed(drainS, 2)} s after the load stopped`,
    )
  }
  if (SQL_LATENCY_RATE > 0) {
    const lat = await commitToPush(broker.url, db.url, SQL_LATENCY_RATE, MEASURE_S)
    console.log(
      `commit to push (hookq_produce, ${SQL_LATENCY_RATE} transactions/s for ${MEASURE_S} s, ${lat.n} messages): ` +
        `p50 ${fixed(lat.p50, 1)} ms, p99 ${fixed(lat.p99, 1)} ms, max ${fixed(lat.max, 1)} ms`,
    )
  }

  const all = baseline ? [{ label: 'INSERT baseline (pool 8, 64 loops)', connections: 64, batch: 1, m: baseline }, ...rows] : rows
  console.log(`\n${table(all)}\n`)
  console.log(
    `(CPU in % of one core over the measured window, ${cpus().length} cores = ${cpus().length * 100}%; pg = all postgres ` +
      `processes; loadgen = the worker process; other = the rest of the host's busy time, i.e. other tenants)\n`,
  )
  console.log(goals(rows, baseline))

  const brokerPid = broker.pid
  await stopBroker(broker)
  if (broker.child.exitCode !== 0)
    console.error(`the broker exited with ${broker.child.exitCode ?? broker.child.signalCode}:\n${broker.output()}`)
  if (CPU_PROF_DIR) {
    // V8 names the file CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile; thread 0 is the main one
    // (tsx's module loader thread writes its own, about start-up only).
    const name = readdirSync(join(ROOT, CPU_PROF_DIR)).find((f) => f.includes(`.${brokerPid}.0.`) && f.endsWith('.cpuprofile'))
    if (name === undefined) console.error(`no CPU profile of pid ${brokerPid} in ${CPU_PROF_DIR}`)
    else
      console.log(
        `\nbroker CPU profile ${join(CPU_PROF_DIR, name)}\n${formatSummary(summarizeProfile(join(ROOT, CPU_PROF_DIR, name)), 20)}`,
      )
  }
  console.log(`\nwhole run ${((Date.now() - started) / 1000).toFixed(0)} s`)
}

await runBench(main)

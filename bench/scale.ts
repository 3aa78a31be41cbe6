/**
 * Several broker processes on one database (`BENCH_SCENARIOS=scale npm run bench`): the same load through 1, 2 and
 * 4 processes, each count a fresh database and a fresh `HOOKQ_PROCESSES=N npm start` (one command,
 * N processes on one port, node:cluster), so that what is measured is the design of issue 10: every
 * process owns its share of the partitions and pushes it.
 *
 * Per process count, once every process has joined and the partitions are spread:
 *   - produce BENCH_MESSAGES messages (batches of 100, 4 producer loops, through the shared port) to
 *     a topic of BENCH_PARTITIONS partitions with one auto-mode group pushing to one receiver
 *     (bench/e2e-receiver.ts), and time it from the first produce call to the last completion;
 *   - CPU from /proc of every broker process (and of the primary, which runs no broker) and of all
 *     PostgreSQL processes, per message completed;
 *   - each process's partitions (hookq_partitions_owned) and pushes (hookq_pushes_total), read from
 *     its own /metrics on the loopback port it advertises to the others (broker_members).
 *
 * On a 2-core machine the total cannot grow much (PostgreSQL, the receiver and the load share the
 * cores): what this shows is that coordination is cheap (CPU per message flat as processes are
 * added) and that each process pushes its share. Ratios, not bare times: the machine is shared.
 *
 * Before that, BENCH_WARMUP_MESSAGES (20,000; 0 for none) per process go the same way unmeasured:
 * each process compiles its hot code under its first load, a cost per process, not per message.
 *
 * BENCH_ROUNDS=R runs the counts R times in turn (1, 2, 4, 1, 2, 4, ...) and prints each count's
 * ratios to the first count of its own round, then their medians: the machine's speed drifts by
 * more than the difference measured, so only counts run side by side compare.
 *
 * Environment (all optional): BENCH_SCALE_PROCESSES=1,2,4  BENCH_ROUNDS=1  BENCH_MESSAGES=60000  BENCH_WARMUP_MESSAGES=20000
 *   BENCH_PARTITIONS=8  BENCH_MAX_IN_FLIGHT=200  BENCH_MAX_SECONDS=60
 *   BENCH_SCALE_RATE=<msg/s> (the measured pass paced at that rate, the same for every count)
 */
import { readFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import type { ReceiverStats } from './e2e-receiver.ts'
import { startBroker, stopBroker } from './lib/broker.ts'
import { createBenchDatabase } from './lib/db.ts'
import { envCount, envInt, SERVER_URL } from './lib/env.ts'
import { type IpcWorker, startIpcWorker } from './lib/ipc.ts'
import { cpuSince, cpuSnapshot, perMessage, processCpuSeconds } from './lib/proc.ts'
import { building, cleanUpOnInterrupt, runBench } from './lib/run.ts'
import { Target } from './lib/scenarios.ts'
import { median } from './lib/stats.ts'

const COUNTS = (process.env.BENCH_SCALE_PROCESSES || '1,2,4').split(',').map((s) => {
  const n = Number(s)
  if (!Number.isInteger(n) || n < 1 || n > 64) throw new Error(`BENCH_SCALE_PROCESSES: ${JSON.stringify(s)} is not a process count`)
  return n
})
const ROUNDS = envInt('BENCH_ROUNDS', 1)
const WARMUP = envCount('BENCH_WARMUP_MESSAGES', 20_000)
const CFG = {
  messages: envInt('BENCH_MESSAGES', 60_000),
  partitions: envInt('BENCH_PARTITIONS', 8),
  maxInFlight: envInt('BENCH_MAX_IN_FLIGHT', 200),
  maxSeconds: envInt('BENCH_MAX_SECONDS', 60),
  batch: 100,
  producers: 4,
}
/** Messages a second the measured pass produces at (unset: as fast as the brokers answer). */
const RATE = process.env.BENCH_SCALE_RATE ? envInt('BENCH_SCALE_RATE', 0) : undefined

cleanUpOnInterrupt('the brokers, the receiver and the load')

/** The pids of a process's children (the broker processes node:cluster started). */
function childPids(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number)
  } catch {
    return []
  }
}

interface Member {
  url: string
  backendPid: number
}

/** The live members (their session holds the members' lock), with the URL each advertises. */
async function members(c: pg.Client): Promise<Member[]> {
  const { rows } = await c.query<{ url: string | null; pid: number }>(
    `SELECT m.url, m.backend_pid AS pid FROM broker_members m JOIN pg_locks l ON l.pid = m.backend_pid
     AND l.locktype = 'advisory' AND l.mode = 'ShareLock' AND l.granted`,
  )
  return rows.filter((r) => r.url !== null).map((r) => ({ url: r.url!, backendPid: r.pid }))
}

/** One process's own counters, from its /metrics: its CPU seconds (getrusage, as /proc counts them), partitions owned, pushes made. */
async function metricsOf(url: string): Promise<{ cpuS: number; owned: number; pushes: number }> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(10_000) })).text()
  const one = (re: RegExp) => Number(re.exec(text)?.[1] ?? NaN)
  let pushes = 0
  for (const m of text.matchAll(/^hookq_pushes_total\{[^}]*\} (\d+)/gm)) pushes += Number(m[1])
  return { cpuS: one(/^process_cpu_seconds_total ([\d.e+-]+)/m), owned: one(/^hookq_partitions_owned (\d+)/m), pushes }
}

interface Row {
  processes: number
  msgPerS: number
  seconds: number
  brokerUs: number
  pgUs: number
  primaryUs: number
  perProcess: { usPerMsg: number; usPerPush: number; owned: number; pushShare: number }[]
  duplicates: number
  /** Transactions committed in the bench's database per 1,000 messages: how well the processes batch. */
  commitsPerK: number
  notes: string
}

/**
 * Transactions committed in the connection's database, counted a second after the call:
 * PostgreSQL 15 counts a backend's commits when it goes idle or at most a second later. (The
 * brokers' polls meanwhile add a few.)
 */
async function commitsSettled(c: pg.Client): Promise<number> {
  await sleep(1100)
  await c.query('SELECT pg_stat_clear_snapshot()')
  const r = await c.query<{ n: string }>('SELECT xact_commit AS n FROM pg_stat_database WHERE datname = current_database()')
  return Number(r.rows[0]!.n)
}

/**
 * A broker command of `n` processes (HOOKQ_PROCESSES=n) on a database of its own, with a topic and an
 * auto-mode group pushing to the receiver, once every process has joined and the partitions are
 * spread. What is started is undone if a later step fails, and by stop().
 */
function deploy(n: number, name: string, receiver: IpcWorker, load: IpcWorker) {
  return building(async (undo) => {
    const db = await createBenchDatabase(SERVER_URL)
    if (!process.env.BENCH_KEEP_DB) undo.add(() => db.drop())
    const broker = await startBroker(db.url, { timeoutMs: 90_000, env: { HOOKQ_PROCESSES: String(n), HOOKQ_CLUSTER_POLL_MS: '500' } })
    undo.add(() => stopBroker(broker))
    const c = new pg.Client({ connectionString: db.url })
    // An interrupt drops the database WITH (FORCE) while this session may still be open.
    c.on('error', () => {})
    await c.connect()
    undo.add(() => c.end())
    const t = new Target(broker, receiver, load, CFG)
    await t.createGroup(name, 'auto')
    // Every process joined and the partitions spread (each owns its share, all of them owned).
    let ms: Member[] = []
    for (let i = 0; i < 600; i++) {
      ms = await members(c)
      if (ms.length === n) {
        const m = await Promise.all(ms.map((x) => metricsOf(x.url)))
        if (m.reduce((a, b) => a + b.owned, 0) === CFG.partitions && m.every((b) => b.owned >= Math.floor(CFG.partitions / n))) break
      }
      await sleep(100)
    }
    if (ms.length !== n) throw new Error(`${n} processes asked for, ${ms.length} joined`)
    // HOOKQ_PROCESSES=1 runs the broker in the process started; more run as its children.
    return { t, c, members: ms, workers: n === 1 ? [broker.pid] : childPids(broker.pid) }
  })
}

/** `n` processes through one command sharing the partitions of one topic, on a database of their own. */
async function scenario(n: number, receiver: IpcWorker, load: IpcWorker): Promise<Row> {
  const name = `scale-${n}`
  const d = await deploy(n, name, receiver, load)
  const { t } = d
  try {
    /** Produces `total` more messages and waits for them to complete: what came of it, and the messages completed of them. */
    const pass = async (total: number, completedBefore: number, rate?: number) => {
      await receiver.call('scenario', { name, mode: 'count', expect: total }, 5000)
      await sleep(500)
      const deadline = Date.now() + CFG.maxSeconds * 1000
      const done = receiver.next('done', CFG.maxSeconds * 1000 + 5000).catch(() => undefined)
      const r = await t.produce(name, total, rate)
      if (r.produced < total) await receiver.call('expect', { n: r.produced }, 5000)
      await Promise.race([done, sleep(Math.max(0, deadline - Date.now()))])
      // Completed: the committed offsets (the receiver's count says pushed, not yet committed).
      const c = await t.completed(name, completedBefore + r.produced, performance.timeOrigin + performance.now() + 10_000)
      return { r, completed: c.completed - completedBefore }
    }
    // Each process compiles its hot code under the first load (about 2 s of CPU a process): once
    // per process, so N processes would pay it N times in the figures. Run it off first, as much of
    // it per process as one process gets: a process of four that had seen a quarter of the warm-up
    // was still compiling its per-batch code in the measured pass.
    const warm = WARMUP > 0 ? await pass(WARMUP * n, 0) : { completed: 0 }
    const commits0 = await commitsSettled(d.c)
    const before = await Promise.all(d.members.map((m) => metricsOf(m.url)))
    const cpu0 = d.workers.map((pid) => processCpuSeconds(pid) ?? NaN)
    const primary0 = n === 1 ? 0 : (processCpuSeconds(t.broker.pid) ?? NaN)
    const base = cpuSnapshot(undefined)
    const { r, completed } = await pass(CFG.messages, warm.completed, RATE)
    const endAt = performance.timeOrigin + performance.now()
    const w = cpuSince(base, undefined)
    const brokerS = d.workers.reduce((a, pid, i) => a + (processCpuSeconds(pid) ?? NaN) - cpu0[i]!, 0)
    const primary = n === 1 ? 0 : (processCpuSeconds(t.broker.pid) ?? NaN) - primary0
    const after = await Promise.all(d.members.map((m) => metricsOf(m.url)))
    const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
    const commits = (await commitsSettled(d.c)) - commits0
    const pushes = after.map((a, i) => a.pushes - before[i]!.pushes)
    const totalPushes = pushes.reduce((a, b) => a + b, 0)
    const cpu = after.map((a, i) => a.cpuS - before[i]!.cpuS)
    const seconds = (endAt - r.firstSendAt) / 1000
    const us = perMessage(w, completed, brokerS)
    return {
      processes: n,
      msgPerS: completed / seconds,
      seconds,
      brokerUs: us.brokerUs,
      pgUs: us.postgresUs,
      primaryUs: (1e6 * primary) / completed,
      perProcess: after.map((a, i) => ({
        usPerMsg: (1e6 * cpu[i]!) / completed,
        usPerPush: (1e6 * cpu[i]!) / Math.max(1, pushes[i]!),
        owned: a.owned,
        pushShare: pushes[i]! / Math.max(1, totalPushes),
      })),
      duplicates: st.duplicates,
      commitsPerK: (1000 * commits) / completed,
      notes: [
        completed < r.produced ? `ONLY ${completed} of ${r.produced} completed` : '',
        d.workers.length !== n ? `${d.workers.length} worker pids seen` : '',
        `${Math.round(w.hostPct * w.cores)}% of one core busy on the host`,
      ]
        .filter(Boolean)
        .join('; '),
    }
  } finally {
    await d.stop()
  }
}

const TABLE_HEAD =
  'processes  msg/s   ratio  broker us/msg  ratio  pg us/msg  commits/1k msg  spread of pushes (min..max share)  partitions owned'

function tableLine(r: Row, base: Row): string {
  const shares = r.perProcess.map((p) => p.pushShare)
  return (
    `${String(r.processes).padStart(9)}  ${Math.round(r.msgPerS).toString().padStart(6)}  ${(r.msgPerS / base.msgPerS).toFixed(2).padStart(5)}x` +
    `  ${r.brokerUs.toFixed(0).padStart(13)}  ${(r.brokerUs / base.brokerUs).toFixed(2).padStart(4)}x  ${r.pgUs.toFixed(0).padStart(9)}  ${r.commitsPerK.toFixed(1).padStart(14)}` +
    `  ${(100 * Math.min(...shares)).toFixed(0).padStart(16)}%..${(100 * Math.max(...shares)).toFixed(0)}%` +
    `${''.padStart(13)}${r.perProcess.map((p) => p.owned).join(' / ')}`
  )
}

function printRow(row: Row): void {
  const n = row.processes
  console.log(
    `${n} process${n > 1 ? 'es' : ''}: ${Math.round(row.msgPerS).toLocaleString('en-US')} msg/s over ${row.seconds.toFixed(2)} s; ` +
      `broker ${row.brokerUs.toFixed(0)} us/msg (all processes${n > 1 ? `; the primary ${row.primaryUs.toFixed(1)}` : ''}), PostgreSQL ${row.pgUs.toFixed(0)} us/msg, ${row.commitsPerK.toFixed(1)} commits per 1,000 messages; duplicates ${row.duplicates}` +
      (row.notes ? `\n  ${row.notes}` : ''),
  )
  for (const [i, p] of row.perProcess.entries()) {
    console.log(
      `  process ${i + 1}: ${p.owned} partitions, ${(100 * p.pushShare).toFixed(0)}% of the pushes, ${p.usPerMsg.toFixed(0)} us CPU per message of the run, ${p.usPerPush.toFixed(0)} us per own push`,
    )
  }
}

async function main(): Promise<void> {
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: 'http://127.0.0.1:1' }, 30_000)
  const load = await startIpcWorker('bench/e2e-load.ts', {}, 30_000)
  console.log(
    `hookq scale bench: ${CFG.messages.toLocaleString('en-US')} messages per run, ${CFG.partitions} partitions, auto mode, maxInFlight ${CFG.maxInFlight}, ` +
      `processes ${COUNTS.join(', ')}; ${RATE === undefined ? 'as fast as the brokers answer' : `paced at ${RATE.toLocaleString('en-US')} msg/s`}; host ${cpus().length} cores\n`,
  )
  const rounds: Row[][] = []
  for (let round = 1; round <= ROUNDS; round++) {
    if (ROUNDS > 1) console.log(`round ${round} of ${ROUNDS}`)
    const rows: Row[] = []
    for (const n of COUNTS) {
      const row = await scenario(n, receiver, load)
      rows.push(row)
      printRow(row)
    }
    rounds.push(rows)
  }
  for (const [i, rows] of rounds.entries()) {
    console.log(`\n${ROUNDS > 1 ? `round ${i + 1}: ` : ''}${TABLE_HEAD}`)
    for (const r of rows) console.log(tableLine(r, rows[0]!))
  }
  if (ROUNDS > 1) {
    console.log("\nmedians over the rounds of the ratio to the same round's first count:")
    console.log('processes  msg/s ratio  broker us/msg ratio  pg us/msg ratio  commits/1k msg')
    for (const [j, n] of COUNTS.entries()) {
      const ratio = (f: (r: Row) => number) => median(rounds.map((rows) => f(rows[j]!) / f(rows[0]!))).toFixed(2)
      const commits = median(rounds.map((rows) => rows[j]!.commitsPerK)).toFixed(1)
      console.log(
        `${String(n).padStart(9)}  ${ratio((r) => r.msgPerS).padStart(10)}x  ${ratio((r) => r.brokerUs).padStart(18)}x  ${ratio((r) => r.pgUs).padStart(14)}x  ${commits.padStart(14)}`,
      )
    }
  }
  console.log(
    '\nbroker us/msg: CPU of every broker process (not the primary, which only supervises) per message completed;\n' +
      "pg: the bench server's PostgreSQL processes; ratios to the first process count of the same round. Spread: each process's share of the pushes.\n" +
      "commits: transactions committed in the bench's database (pg_stat_database) per 1,000 messages: appends, progress, attempt rows, polls.",
  )
  await Promise.all([receiver.stop(), load.stop()])
}

await runBench(main)

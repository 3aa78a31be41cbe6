/**
 * The end-to-end scenarios of `npm run bench` (bench/bench.ts runs this file for them; what each
 * measures: bench/lib/scenarios.ts): a fresh database, the broker as a child process on it (started
 * as `npm start` starts it), a webhook receiver (bench/e2e-receiver.ts) and a load process
 * (bench/e2e-load.ts), each its own process.
 *
 * BENCH_MESSAGES (100,000) a scenario, produced BENCH_BATCH (100) a call from BENCH_PRODUCERS (4)
 * loops; the latency scenario at each of BENCH_RATES (5000,500) msg/s for 10 s after 2 s not
 * counted. BENCH_AUTH (none, headers, jwt, oauth) gives every consumer that push authentication:
 * its CPU per message, as a ratio to a run with none, is the cost of push authentication
 * (docs/performance.md, "Push authentication").
 *
 * Before them, BENCH_WARMUP_MESSAGES (20,000; 0 for none) go through the broker unmeasured: a fresh
 * broker spends ~2 s in V8's optimising compiler under its first load, a cost per process, not per
 * message. A scenario that does not finish within BENCH_MAX_SECONDS reports what completed.
 */
import { cpus } from 'node:os'
import { startBroker, stopBroker } from './lib/broker.ts'
import { createBenchDatabase, serverSettings } from './lib/db.ts'
import { envCount, envInt, envList, SERVER_URL } from './lib/env.ts'
import { startIpcWorker } from './lib/ipc.ts'
import { othersPct, perMessage } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { authType, ceiling, consumerAuth, drain, latency, produceOnly, type Row, Target, throughput } from './lib/scenarios.ts'
import { fixed, int, ratio, table } from './lib/stats.ts'

const SCENARIOS = new Set(envList('BENCH_SCENARIOS', 'ceiling,produce,auto,explicit,latency'))
const CFG = {
  messages: envInt('BENCH_MESSAGES', 100_000),
  partitions: envInt('BENCH_PARTITIONS', 8),
  maxInFlight: envInt('BENCH_MAX_IN_FLIGHT', 200),
  maxSeconds: envInt('BENCH_MAX_SECONDS', 30),
  batch: Math.min(1000, envInt('BENCH_BATCH', 100)),
  producers: envInt('BENCH_PRODUCERS', 4),
}
const WARMUP_MESSAGES = envCount('BENCH_WARMUP_MESSAGES', 20_000)
const RATES = envList('BENCH_RATES', '5000,500').map((r) => {
  const n = Number(r)
  if (!Number.isFinite(n) || n <= 0) throw new Error(`BENCH_RATES: "${r}" is not a positive number`)
  return n
})
const AUTH = authType('BENCH_AUTH')

cleanUpOnInterrupt('the load, the receiver and the broker')

function printTable(rows: Row[]): string {
  const head = [
    'scenario',
    'msg/s',
    'seconds',
    'p50 ms',
    'p99 ms',
    'broker us/msg',
    'pg us/msg',
    'broker CPU%',
    'pg CPU%',
    'other CPU%',
    'dups',
  ]
  const body = rows.map((r) => {
    // The ceiling's window is the load process's, not the broker's.
    const m = r.label.startsWith('ceiling') ? { brokerUs: NaN, postgresUs: NaN } : perMessage(r.cpu, r.messages)
    return [
      r.label,
      int(r.perS),
      fixed(r.seconds, 2),
      fixed(r.p50, 2),
      fixed(r.p99, 2),
      fixed(m.brokerUs, 0),
      fixed(m.postgresUs, 0),
      fixed(r.label.startsWith('ceiling') ? NaN : r.cpu.brokerPct, 0),
      fixed(r.cpu.postgresPct, 0),
      fixed(othersPct(r.cpu), 0),
      int(r.duplicates),
    ]
  })
  return table(head, body)
}

/** The ratios to the baselines of this run: the ceiling for pushes, produce alone for the push's share, single pushes for batches. */
function ratios(rows: Map<string, Row>): string[] {
  const [ceil, prod, auto, explicit, drained, batched] = ['ceiling', 'produce', 'auto', 'explicit', 'drain', 'batch'].map((k) =>
    rows.get(k),
  )
  const us = (r: Row | undefined) => (r ? perMessage(r.cpu, r.messages).brokerUs : NaN)
  const out: string[] = []
  if (ceil) {
    for (const r of [auto, explicit, drained, batched])
      if (r) out.push(`${r.label.split(':')[0]} msg/s / ceiling POSTs/s: ${ratio(r.perS, ceil.perS)}`)
    if (auto) out.push(`auto broker CPU per message / load CPU per bare POST: ${ratio(us(auto), ceil.loadUs)}`)
  }
  if (prod && auto)
    out.push(`broker CPU per message: produce ${fixed(us(prod), 0)} us, push and completion ${fixed(us(auto) - us(prod), 0)} us (auto)`)
  if (drained && batched) out.push(`batch msg/s / drain msg/s: ${ratio(batched.perS, drained.perS)}`)
  return out
}

async function main(): Promise<void> {
  const settings = await serverSettings(SERVER_URL)
  // First: it also tells the CPU accounting which server is ours (countPostgresOf).
  const db = (run.db = await createBenchDatabase(SERVER_URL))
  const started = Date.now()
  const broker = (run.broker = await startBroker(db.url, { timeoutMs: 90_000 }))
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: broker.url }, 30_000)
  const load = await startIpcWorker('bench/e2e-load.ts', {}, 30_000)
  const auth = await consumerAuth(AUTH)
  const t = new Target(broker, receiver, load, CFG, auth.auth)
  const hookq = Object.entries(process.env).filter(([k]) => k.startsWith('HOOKQ_'))
  console.log(
    `hookq end to end: ${int(CFG.messages)} messages a scenario, ${CFG.partitions} partitions, maxInFlight ${CFG.maxInFlight}; ` +
      `${hookq.length ? hookq.map(([k, v]) => `${k}=${v}`).join(' ') : 'broker defaults'}; consumer auth ${AUTH} (BENCH_AUTH); ${cpus().length} cores; ` +
      `PostgreSQL ${settings.server_version} fsync=${settings.fsync} synchronous_commit=${settings.synchronous_commit}\n`,
  )
  const say = (r: Row) =>
    console.log(
      `${r.label}: ${int(r.perS)}/s over ${fixed(r.seconds, 2)} s, p50/p99 ${fixed(r.p50, 2)}/${fixed(r.p99, 2)} ms\n  ${r.notes}`,
    )
  if (WARMUP_MESSAGES > 0 && [...SCENARIOS].some((s) => s !== 'ceiling')) {
    const w = await throughput(t, 'auto', WARMUP_MESSAGES, 'e2e-warmup')
    console.log(`warm-up, not counted: ${int(w.messages)} messages, ${fixed(perMessage(w.cpu, w.messages).brokerUs, 0)} broker us/msg\n`)
  }
  const rows = new Map<string, Row>()
  const runs: [string, () => Promise<Row>][] = [
    ['ceiling', () => ceiling(t)],
    ['produce', () => produceOnly(t)],
    ['auto', () => throughput(t, 'auto')],
    ['explicit', () => throughput(t, 'explicit')],
    ['drain', () => drain(t, undefined)],
    ['batch', () => drain(t, 100)],
    ...RATES.map((rate): [string, () => Promise<Row>] => [`latency-${rate}`, () => latency(t, rate)]),
  ]
  for (const [key, scenario] of runs) {
    if (!SCENARIOS.has(key.startsWith('latency') ? 'latency' : key)) continue
    const r = await scenario()
    rows.set(key, r)
    say(r)
  }
  console.log(`\n${printTable([...rows.values()])}\n`)
  console.log(
    'msg/s: ceiling POSTs/s; produce msg/s produced; auto/explicit completed / (last completion - first produce call); drain and\n' +
      'batch completed / (last completion - unpause); latency calls/s sent. us/msg: CPU per message from /proc (pg: the bench\n' +
      "server's processes); CPU% of one core; other: the rest of the host (the load but in the ceiling's row, the receiver, others).\n",
  )
  for (const line of ratios(rows)) console.log(line)
  if (AUTH === 'oauth') console.log(`oauth: ${auth.tokens()} token(s) fetched from the bench's token endpoint`)
  auth.close()
  await Promise.all([receiver.stop(), load.stop()])
  await stopBroker(broker)
  console.log(`\nwhole run ${((Date.now() - started) / 1000).toFixed(0)} s`)
}

await runBench(main)

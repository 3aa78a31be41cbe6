/**
 * `npm run bench [scenarios]`: the one benchmark command. Scenarios (comma-separated, the argument
 * or BENCH_SCENARIOS; default ceiling,produce,auto,explicit,latency):
 *
 *   ceiling produce auto explicit drain batch latency   one broker end to end (bench/e2e.ts)
 *   scale       1, 2 and 4 broker processes on one database (bench/scale.ts)
 *   peers       hookq beside graphile-worker, pg-boss, RabbitMQ and NATS JetStream (bench/peers.ts)
 *   schedules   1,000 schedules ticking every second (bench/schedules.ts)
 *   pull        pull + ack by 8 callers against auto-mode push; a long poll's answer (bench/pull.ts)
 *   failover    two processes, one SIGKILLed a round: kill to resume, duplicates a kill (bench/failover.ts)
 *   retention   storage under steady traffic with retentions (bench/retention.ts)
 *   ab          this checkout's broker against BENCH_AB_BASE's, in alternating rounds of BENCH_AB_SCENARIO
 *               (drain, auto, explicit or latency; bench/ab.ts)
 *
 * Each file runs in a process of its own, one after the other, on a throw-away database, and prints
 * the CPU per message of the broker and of PostgreSQL (bench/lib/proc.ts, from /proc) beside a
 * baseline measured in the same run: the machines are shared, so only ratios within a run compare.
 * The common options: BENCH_MESSAGES (messages a scenario), BENCH_RATES (the latency scenario's
 * msg/s), BENCH_PARTITIONS, BENCH_MAX_IN_FLIGHT, BENCH_MAX_SECONDS, BENCH_DATABASE_URL (else
 * DATABASE_URL), BENCH_KEEP_DB, BENCH_ROOT (the broker of another checkout); each file's header lists
 * the few of its own. HOOKQ_* settings reach the broker. The measuring is in bench/lib (CPU from /proc,
 * percentiles and tables, the broker, the receiver and load processes, the end-to-end scenarios).
 * A new scenario is a file that runs on its own and a line in SCRIPTS.
 */
import { spawnSync } from 'node:child_process'
import { ROOT } from './lib/child.ts'
import { envList } from './lib/env.ts'

/** Which file runs which scenarios (all of a file's named scenarios in one run of it). */
const SCRIPTS: Record<string, { file: string; scenarios: string[]; benchDeps?: boolean }> = {
  e2e: { file: 'bench/e2e.ts', scenarios: ['ceiling', 'produce', 'auto', 'explicit', 'drain', 'batch', 'latency'] },
  scale: { file: 'bench/scale.ts', scenarios: ['scale'] },
  peers: { file: 'bench/peers.ts', scenarios: ['peers'], benchDeps: true },
  schedules: { file: 'bench/schedules.ts', scenarios: ['schedules'] },
  pull: { file: 'bench/pull.ts', scenarios: ['pull'] },
  failover: { file: 'bench/failover.ts', scenarios: ['failover'] },
  retention: { file: 'bench/retention.ts', scenarios: ['retention'] },
  ab: { file: 'bench/ab.ts', scenarios: ['ab'] },
}

const asked = (process.argv[2] ? process.argv[2].split(',') : envList('BENCH_SCENARIOS', 'ceiling,produce,auto,explicit,latency'))
  .map((s) => s.trim())
  .filter(Boolean)
const known = Object.values(SCRIPTS).flatMap((s) => s.scenarios)
const unknown = asked.filter((s) => !known.includes(s))
if (unknown.length > 0) {
  console.error(`bench: unknown scenario ${unknown.join(', ')} (known: ${known.join(', ')})`)
  process.exit(2)
}

let failed = 0
for (const [name, script] of Object.entries(SCRIPTS)) {
  const mine = asked.filter((s) => script.scenarios.includes(s))
  if (mine.length === 0) continue
  if (script.benchDeps) {
    const deps = spawnSync(process.execPath, ['scripts/bench-deps.mjs'], { cwd: ROOT, stdio: 'inherit' })
    if (deps.status !== 0) process.exit(deps.status ?? 1)
  }
  if (asked.length > mine.length) console.log(`\n==== ${name}: ${mine.join(', ')}\n`)
  // The child gets the terminal's Ctrl-C itself and cleans up after itself (bench/lib/run.ts).
  const env = { ...process.env, BENCH_SCENARIOS: mine.join(',') }
  const r = spawnSync(process.execPath, ['--import', 'tsx', script.file], { cwd: ROOT, env, stdio: 'inherit' })
  if (r.status !== 0) {
    failed++
    console.error(`bench: ${script.file} ${r.signal ? `ended by ${r.signal}` : `exited with ${r.status}`}`)
    if (r.signal === 'SIGINT' || r.status === 130) break
  }
}
process.exitCode = failed > 0 ? 1 : 0

/**
 * This checkout's broker against another checkout's, in turns, on the same load
 * (`BENCH_AB_BASE=<dir> npm run bench:ab`, that is `npm run bench ab`): the broker's and PostgreSQL's
 * CPU per message of each, and their ratio, measured pair by pair.
 *
 * Why turns of a few seconds: these machines drift (the same code ran 1.4x slower for minutes at a
 * time), so two runs of bench:e2e minutes apart cannot resolve a change of 10%. Here both brokers
 * run all along, each on a database of its own with a webhook receiver of its own, and the rounds
 * alternate A B B A ... with each measured window a few seconds long, so a drift lands on both sides
 * alike. The ratio is taken within each pair of adjacent windows and reported as the median of those.
 *
 * A round of one side is one of bench/lib/scenarios.ts's end-to-end scenarios on a fresh topic and
 * group (BENCH_PARTITIONS 8, BENCH_MAX_IN_FLIGHT 200; batches of 100 from 4 producers):
 *   drain     BENCH_AB_MESSAGES produced to the group paused, measured from its unpause: the push path alone
 *   auto      the group pushing while BENCH_AB_MESSAGES are produced: produce and push
 *   explicit  the same with ackMode explicit, the receiver acking over HTTP
 *   latency   single-message calls at BENCH_AB_RATE (500) a second for BENCH_AB_SECONDS (6), the
 *             first half second not counted: CPU per call, produce-to-push and call p50/p99
 *
 * The base is any directory holding a hookq checkout with its node_modules (a git worktree of
 * another commit, with node_modules linked and `npm run db:generate` run). Its broker starts as its
 * package.json says, like this one's.
 *
 * Environment (all optional but the base):
 *   BENCH_AB_BASE=<dir>          the other checkout (required)
 *   BENCH_AB_THIS=<dir>          a checkout in place of this one (to pair two other commits)
 *   BENCH_AB_SCENARIO=drain      drain | auto | explicit | latency
 *   BENCH_AB_ROUNDS=6            rounds per side (measured)
 *   BENCH_AB_WARMUP=2            rounds per side before them, not counted (JIT, pools, caches)
 *   BENCH_AB_MESSAGES=20000      messages per round
 *   BENCH_AUTH=none              the consumers' push authentication (as bench:e2e's)
 *   BENCH_AB_BASE_AUTH=<auth>    the base side's, when it differs: with BENCH_AB_BASE this checkout
 *                                too, the cost of an auth type against none, pair by pair
 */
import { existsSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { startBroker, stopBroker } from './lib/broker.ts'
import { ROOT } from './lib/child.ts'
import { createBenchDatabase } from './lib/db.ts'
import { envInt, SERVER_URL } from './lib/env.ts'
import { type IpcWorker, startIpcWorker } from './lib/ipc.ts'
import { othersPct, perMessage } from './lib/proc.ts'
import { atCleanup, cleanUpOnInterrupt, runBench } from './lib/run.ts'
import { authType, consumerAuth, drain, latency, type Row, Target, throughput } from './lib/scenarios.ts'
import { median } from './lib/stats.ts'

const BASE = process.env.BENCH_AB_BASE ? resolve(process.env.BENCH_AB_BASE) : ''
const THIS = process.env.BENCH_AB_THIS ? resolve(process.env.BENCH_AB_THIS) : ROOT
const SCENARIO = process.env.BENCH_AB_SCENARIO || 'drain'
const ROUNDS = envInt('BENCH_AB_ROUNDS', 6)
const WARMUP = envInt('BENCH_AB_WARMUP', 2)
const RATE = envInt('BENCH_AB_RATE', 500)
const SECONDS = envInt('BENCH_AB_SECONDS', 6)
const CFG = {
  messages: envInt('BENCH_AB_MESSAGES', 20_000),
  partitions: envInt('BENCH_PARTITIONS', 8),
  maxInFlight: envInt('BENCH_MAX_IN_FLIGHT', 200),
  maxSeconds: 120, // a round that takes longer is reported as timed out
  batch: 100,
  producers: 4,
}
const AUTH = authType('BENCH_AUTH')
const BASE_AUTH = authType('BENCH_AB_BASE_AUTH', AUTH)

type SideName = 'base' | 'this'
interface Measured {
  side: SideName
  round: number
  row: Row
  brokerUs: number
  postgresUs: number
}

const ROUND: Record<string, (t: Target, name: string) => Promise<Row>> = {
  drain: (t, name) => drain(t, undefined, name),
  auto: (t, name) => throughput(t, 'auto', undefined, name),
  explicit: (t, name) => throughput(t, 'explicit', undefined, name),
  latency: (t, name) => latency(t, RATE, 0.5, SECONDS, name),
}

async function startSide(root: string, auth: Parameters<typeof consumerAuth>[0], load: IpcWorker): Promise<Target> {
  if (!existsSync(join(root, 'package.json')) || !existsSync(join(root, 'node_modules')))
    throw new Error(`${root} holds no checkout with node_modules`)
  const db = await createBenchDatabase(SERVER_URL)
  atCleanup(() => db.drop())
  const broker = await startBroker(db.url, { timeoutMs: 90_000, root })
  atCleanup(() => stopBroker(broker))
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: broker.url }, 30_000)
  const a = await consumerAuth(auth)
  atCleanup(async () => a.close())
  return new Target(broker, receiver, load, CFG, a.auth)
}

async function main(): Promise<void> {
  if (!BASE) throw new Error('BENCH_AB_BASE must name the other checkout (a directory with package.json and node_modules)')
  const round = ROUND[SCENARIO]
  if (!round) throw new Error(`BENCH_AB_SCENARIO is one of ${Object.keys(ROUND).join(', ')}, not ${SCENARIO}`)
  const load = await startIpcWorker('bench/e2e-load.ts', {}, 30_000)
  const sides: Record<SideName, Target> = { base: await startSide(BASE, BASE_AUTH, load), this: await startSide(THIS, AUTH, load) }
  console.log(
    `bench:ab ${SCENARIO}: base ${BASE} (pid ${sides.base.broker.pid}) against ${THIS === ROOT ? 'this checkout ' : ''}${THIS} (pid ${sides.this.broker.pid}); ` +
      `${ROUNDS} rounds each of ${SCENARIO === 'latency' ? `${SECONDS} s at ${RATE} msg/s` : `${CFG.messages.toLocaleString('en-US')} messages`}, ` +
      `${CFG.partitions} partitions, maxInFlight ${CFG.maxInFlight}, consumer auth ${BASE_AUTH === AUTH ? AUTH : `base ${BASE_AUTH}, this ${AUTH}`}`,
  )
  const measure = async (side: SideName, n: number): Promise<Measured> => {
    const row = await round(sides[side], `ab-${SCENARIO}-${n < 0 ? `w${-n}` : n}`)
    if (row.notes.includes('TIMED OUT') || row.notes.includes('NOT COMPLETED')) throw new Error(`${side} round ${n}: ${row.notes}`)
    return { side, round: n, row, ...perMessage(row.cpu, row.messages) }
  }
  // Warm-up rounds, not counted: the JIT, connection pools, the tables' first pages.
  for (let n = 1; n <= WARMUP; n++) for (const side of ['base', 'this'] as const) await measure(side, -n)
  const rows: Measured[] = []
  const line = (m: Measured) =>
    `${m.side.padEnd(4)} round ${String(m.round).padStart(2)}: broker ${m.brokerUs.toFixed(1).padStart(6)} us/msg, ` +
    `PostgreSQL ${m.postgresUs.toFixed(1).padStart(5)} us/msg, ${Math.round(m.row.perS).toLocaleString('en-US').padStart(7)} msg/s, other CPU ${othersPct(m.row.cpu).toFixed(0)}%` +
    (SCENARIO === 'drain' ? '' : `; produce-to-push p50/p99 ${m.row.p50.toFixed(2)}/${m.row.p99.toFixed(2)} ms`) +
    (m.row.call ? `, call ${m.row.call.p50.toFixed(2)}/${m.row.call.p99.toFixed(2)} ms` : '')
  for (let n = 1; n <= ROUNDS; n++) {
    // A B, then B A: neither side always goes first.
    for (const side of n % 2 === 1 ? (['base', 'this'] as const) : (['this', 'base'] as const)) {
      const m = await measure(side, n)
      rows.push(m)
      console.log(line(m))
    }
  }
  const of = (side: SideName, pick: (m: Measured) => number) => rows.filter((m) => m.side === side).map(pick)
  const ratios = (pick: (m: Measured) => number) => {
    const a = of('base', pick)
    return of('this', pick).map((b, i) => b / a[i]!)
  }
  console.log('\nmedians (each side) and the median of the per-round ratios this / base:')
  const figures: [string, (m: Measured) => number][] = [
    ['broker us/msg', (m) => m.brokerUs],
    ['PostgreSQL us/msg', (m) => m.postgresUs],
    ['msg/s', (m) => m.row.perS],
  ]
  if (SCENARIO !== 'drain')
    figures.push(['p50 ms', (m) => m.row.p50], ['p99 ms', (m) => m.row.p99], ['call p99 ms', (m) => m.row.call!.p99])
  for (const [what, pick] of figures) {
    const r = ratios(pick)
    console.log(
      `  ${what.padEnd(18)} base ${median(of('base', pick)).toFixed(1).padStart(8)}  this ${median(of('this', pick)).toFixed(1).padStart(8)}  ` +
        `ratio ${median(r).toFixed(3)} (rounds: ${r.map((x) => x.toFixed(2)).join(', ')})`,
    )
  }
  const fmt = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(', ')
  console.log(`  broker us/msg per round: base ${fmt(of('base', (m) => m.brokerUs))}; this ${fmt(of('this', (m) => m.brokerUs))}`)
  await Promise.all([sides.base.receiver.stop(), sides.this.receiver.stop(), load.stop()])
}

cleanUpOnInterrupt('both brokers, the receivers and the load')
await runBench(main)

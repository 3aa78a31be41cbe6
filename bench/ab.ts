/**
 * This checkout's broker against another checkout's, in turns, on the same load
 * (`BENCH_AB_BASE=<dir> npm run bench:ab`, that is `npm run bench ab`): the broker's and PostgreSQL's CPU per message of each,
 * and their ratio, measured pair by pair.
 *
 * Why turns of a few seconds: these machines drift (the same code ran 1.4x slower for minutes at a
 * time), so two runs of bench:e2e minutes apart cannot resolve a change of 10%. Here both brokers
 * run all along, each on a database of its own with a webhook receiver of its own
 * (bench/e2e-receiver.ts), and the rounds alternate A B B A ... with each measured window a few
 * seconds long, so a drift lands on both sides alike. The ratio is taken within each pair of
 * adjacent windows and reported as the median of those ratios.
 *
 * A round of one side: a fresh topic and group (8 partitions, ackMode auto, single pushes), then
 *   drain  BENCH_AB_MESSAGES produced to the group paused; measured from its unpause to the last
 *          completion: the push path alone
 *   auto   the group pushing while BENCH_AB_MESSAGES are produced (batches of 100, 4 producers);
 *          measured from the first produce call to the last completion: produce and push
 *   latency  single-message produce calls paced at BENCH_AB_RATE a second for BENCH_AB_SECONDS
 *          (bench/e2e-load.ts `paced`, 64 connections, the first half second not counted),
 *          measured to the last completion: CPU per call, produce-to-push and call p50/p99
 *
 * The base is any directory holding a hookq checkout with its node_modules (a git worktree of
 * another commit, with node_modules linked and `npm run db:generate` run). Its broker starts as its
 * package.json says, like this one's.
 *
 * Environment (all optional but the base):
 *   BENCH_AB_BASE=<dir>          the other checkout (required)
 *   BENCH_AB_THIS=<dir>          a checkout in place of this one (to pair two other commits, such as a
 *                                change and its parent; default this checkout)
 *   BENCH_AB_SCENARIO=drain      drain | auto | latency
 *   BENCH_AB_RATE=500  BENCH_AB_SECONDS=6   the latency scenario's calls a second, and for how long
 *   BENCH_AB_ROUNDS=6            rounds per side (measured)
 *   BENCH_AB_WARMUP=2            rounds per side before them, not counted (JIT, pools, caches)
 *   BENCH_AB_MESSAGES=20000      messages per round
 *   BENCH_AUTH=none              none | headers | jwt: the consumers' push authentication (as bench:e2e's)
 *   BENCH_AB_BASE_AUTH=<auth>    the base side's, when it differs (default BENCH_AUTH): with BENCH_AB_BASE
 *                                this checkout too, the cost of an auth type against none, pair by pair; a
 *                                base from before push auth takes none only
 *   BENCH_PARTITIONS=8  BENCH_MAX_IN_FLIGHT=200
 *   BENCH_DATABASE_URL=...       server for both databases (default postgres@127.0.0.1:5432)
 */
import { existsSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { type BrokerProcess, brokerApi, committedOffsets, startBroker, stopBroker } from './lib/broker.ts'
import { ROOT } from './lib/child.ts'
import { type BenchDatabase, createBenchDatabase } from './lib/db.ts'
import { envInt } from './lib/env.ts'
import { type IpcWorker, startIpcWorker } from './lib/ipc.ts'
import { cpuSince, cpuSnapshot, othersPct, perMessage } from './lib/proc.ts'
import { atCleanup, cleanUpOnInterrupt, runBench } from './lib/run.ts'
import { median } from './lib/stats.ts'

const BASE = process.env.BENCH_AB_BASE ? resolve(process.env.BENCH_AB_BASE) : ''
const THIS = process.env.BENCH_AB_THIS ? resolve(process.env.BENCH_AB_THIS) : ROOT
const SCENARIO = process.env.BENCH_AB_SCENARIO || 'drain'
const ROUNDS = envInt('BENCH_AB_ROUNDS', 6)
const WARMUP = envInt('BENCH_AB_WARMUP', 2)
const MESSAGES = envInt('BENCH_AB_MESSAGES', 20_000)
const RATE = envInt('BENCH_AB_RATE', 500)
const SECONDS = envInt('BENCH_AB_SECONDS', 6)
const PARTITIONS = envInt('BENCH_PARTITIONS', 8)
const MAX_IN_FLIGHT = envInt('BENCH_MAX_IN_FLIGHT', 200)
const AUTH = process.env.BENCH_AUTH || 'none'
const AUTHS: Record<string, object | undefined> = {
  none: undefined,
  headers: { type: 'headers', headers: { 'x-api-key': 'bench-api-key-value' } },
  jwt: { type: 'jwt' },
}
const BASE_AUTH = process.env.BENCH_AB_BASE_AUTH || AUTH
for (const a of [AUTH, BASE_AUTH])
  if (!(a in AUTHS))
    throw new Error(`BENCH_AUTH and BENCH_AB_BASE_AUTH are one of ${Object.keys(AUTHS).join(', ')}, not ${JSON.stringify(a)}`)
const SERVER_URL = process.env.BENCH_DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
/** Cap on one measured window; a round that takes longer fails the run (something is wrong). */
const ROUND_SECONDS = 120

/** What bench/e2e-load.ts's `bulk` answers (the part used here). */
interface BulkResult {
  produced: number
}

interface Side {
  name: 'base' | 'this'
  db: BenchDatabase
  broker: BrokerProcess
  receiver: IpcWorker
  receiverUrl: string
}

interface Measured {
  side: Side['name']
  round: number
  brokerUs: number
  postgresUs: number
  perS: number
  otherPct: number
  /** latency only: produce-to-push and the produce call's own, ms. */
  p50?: number
  p99?: number
  callP50?: number
  callP99?: number
}

async function startSide(name: Side['name'], root: string): Promise<Side> {
  const db = await createBenchDatabase(SERVER_URL)
  atCleanup(() => db.drop())
  const broker = await startBroker(db.url, { timeoutMs: 90_000, root })
  atCleanup(() => stopBroker(broker))
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: broker.url }, 30_000)
  return { name, db, broker, receiver, receiverUrl: `http://127.0.0.1:${receiver.ready.port as number}` }
}

/** One round of one side: its CPU per message over the measured window. */
async function round(side: Side, load: IpcWorker, n: number): Promise<Measured> {
  const name = `ab-${SCENARIO}-${n}`
  const api = (method: string, path: string, body?: unknown) => brokerApi(side.broker.url, method, path, body)
  const group = { topic: name, ackMode: 'auto', maxInFlight: MAX_IN_FLIGHT, ackTimeoutMs: 30_000, pushTimeoutMs: 10_000 }
  await api('PUT', `/v1/topics/${name}`, { partitions: PARTITIONS })
  await api('PUT', `/v1/groups/${name}`, { ...group, paused: SCENARIO === 'drain' })
  const auth = AUTHS[side.name === 'base' ? BASE_AUTH : AUTH]
  await api('POST', `/v1/groups/${name}/consumers`, { url: `${side.receiverUrl}/p/${name}`, ...(auth ? { auth } : {}) })
  await side.receiver.call('scenario', { name, mode: 'count', expect: MESSAGES, group: name }, 5000)
  const produce = () =>
    load.call<BulkResult>(
      'bulk',
      { url: `${side.broker.url}/v1/topics/${name}/messages`, total: MESSAGES, batch: 100, concurrency: 4, maxSeconds: ROUND_SECONDS },
      (ROUND_SECONDS + 60) * 1000,
    )
  if (SCENARIO === 'latency') return paced(side, load, n, name, group)
  if (SCENARIO === 'drain') {
    const r = await produce()
    if (r.produced < MESSAGES) throw new Error(`${side.name}: produced ${r.produced} of ${MESSAGES}`)
  }
  await sleep(300) // the group's start-up reads, the produce answers' aftermath
  const done = side.receiver.next<{ at: number }>('done', ROUND_SECONDS * 1000)
  const c0 = cpuSnapshot(side.broker.pid)
  if (SCENARIO === 'drain') await api('PUT', `/v1/groups/${name}`, { ...group, paused: false })
  else await produce()
  await done
  // Pushed is not completed: the completion of the last pushes follows their answers.
  for (let i = 0; (await committedOffsets(side.broker.url, name)) < MESSAGES; i++) {
    if (i > 10_000) throw new Error(`${side.name}: round ${n} did not complete`)
    await sleep(5)
  }
  const w = cpuSince(c0, side.broker.pid)
  await api('PUT', `/v1/groups/${name}`, { ...group, paused: true })
  return { side: side.name, round: n, ...perMessage(w, MESSAGES), perS: MESSAGES / w.seconds, otherPct: othersPct(w) }
}

/** A latency round: single-message calls at RATE for SECONDS, measured from the first call to the last completion. */
async function paced(side: Side, load: IpcWorker, n: number, name: string, group: object): Promise<Measured> {
  await side.receiver.call('scenario', { name, mode: 'count', expect: 0 }, 5000)
  await sleep(300)
  const c0 = cpuSnapshot(side.broker.pid)
  const r = await load.call<{ produced: number; produceLatencyMs: { p50: number; p99: number } }>(
    'paced',
    {
      url: `${side.broker.url}/v1/topics/${name}/messages`,
      rate: RATE,
      warmupS: 0.5,
      measureS: SECONDS,
      maxOutstanding: 2000,
      connections: 64,
    },
    (ROUND_SECONDS + 60) * 1000,
  )
  for (let i = 0; (await committedOffsets(side.broker.url, name)) < r.produced; i++) {
    if (i > 10_000) throw new Error(`${side.name}: round ${n} did not complete`)
    await sleep(5)
  }
  const w = cpuSince(c0, side.broker.pid)
  await brokerApi(side.broker.url, 'PUT', `/v1/groups/${name}`, { ...group, paused: true })
  const st = await side.receiver.call<{ latencyMs: { p50: number; p99: number } }>('stats', {}, 5000)
  return {
    side: side.name,
    round: n,
    ...perMessage(w, r.produced),
    perS: r.produced / w.seconds,
    otherPct: othersPct(w),
    p50: st.latencyMs.p50,
    p99: st.latencyMs.p99,
    callP50: r.produceLatencyMs.p50,
    callP99: r.produceLatencyMs.p99,
  }
}

async function main(): Promise<void> {
  if (!BASE) throw new Error('BENCH_AB_BASE must name the other checkout (a directory with package.json and node_modules)')
  if (!existsSync(join(BASE, 'package.json')) || !existsSync(join(BASE, 'node_modules')))
    throw new Error(`${BASE} holds no checkout with node_modules`)
  if (!['drain', 'auto', 'latency'].includes(SCENARIO)) throw new Error(`BENCH_AB_SCENARIO is drain, auto or latency, not ${SCENARIO}`)
  const base = await startSide('base', BASE)
  if (!existsSync(join(THIS, 'package.json')) || !existsSync(join(THIS, 'node_modules')))
    throw new Error(`${THIS} holds no checkout with node_modules`)
  const self = await startSide('this', THIS)
  const load = await startIpcWorker('bench/e2e-load.ts', {}, 30_000)
  console.log(
    `bench:ab ${SCENARIO}: base ${BASE} (pid ${base.broker.pid}) against ${THIS === ROOT ? 'this checkout ' : ''}${THIS} (pid ${self.broker.pid}); ` +
      `${ROUNDS} rounds each of ${MESSAGES.toLocaleString('en-US')} messages, ${PARTITIONS} partitions, maxInFlight ${MAX_IN_FLIGHT}, consumer auth ${BASE_AUTH === AUTH ? AUTH : `base ${BASE_AUTH}, this ${AUTH}`}`,
  )
  // Warm-up rounds, not counted: the JIT, connection pools, the tables' first pages.
  for (let n = 1; n <= WARMUP; n++) for (const side of [base, self]) await round(side, load, -n)
  const rows: Measured[] = []
  const line = (m: Measured) =>
    `${m.side.padEnd(4)} round ${String(m.round).padStart(2)}: broker ${m.brokerUs.toFixed(1).padStart(6)} us/msg, ` +
    `PostgreSQL ${m.postgresUs.toFixed(1).padStart(5)} us/msg, ${Math.round(m.perS).toLocaleString('en-US').padStart(7)} msg/s, other CPU ${m.otherPct.toFixed(0)}%` +
    (m.p50 === undefined
      ? ''
      : `; produce-to-push p50/p99 ${m.p50.toFixed(2)}/${m.p99!.toFixed(2)} ms, call ${m.callP50!.toFixed(2)}/${m.callP99!.toFixed(2)} ms`)
  for (let n = 1; n <= ROUNDS; n++) {
    // A B, then B A: neither side always goes first.
    const order = n % 2 === 1 ? [base, self] : [self, base]
    for (const side of order) {
      const m = await round(side, load, n)
      rows.push(m)
      console.log(line(m))
    }
  }
  const of = (side: Side['name'], pick: (m: Measured) => number) => rows.filter((m) => m.side === side).map(pick)
  const ratios = (pick: (m: Measured) => number) => {
    const a = of('base', pick)
    return of('this', pick).map((b, i) => b / a[i]!)
  }
  const fmt = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(', ')
  console.log('\nmedians (each side) and the median of the per-round ratios this / base:')
  for (const [what, pick] of [
    ['broker us/msg', (m: Measured) => m.brokerUs],
    ['PostgreSQL us/msg', (m: Measured) => m.postgresUs],
    ['msg/s', (m: Measured) => m.perS],
    ...(SCENARIO === 'latency'
      ? ([
          ['p50 ms', (m: Measured) => m.p50!],
          ['p99 ms', (m: Measured) => m.p99!],
          ['call p99 ms', (m: Measured) => m.callP99!],
        ] as const)
      : []),
  ] as const) {
    console.log(
      `  ${what.padEnd(18)} base ${median(of('base', pick)).toFixed(1).padStart(8)}  this ${median(of('this', pick)).toFixed(1).padStart(8)}  ` +
        `ratio ${median(ratios(pick)).toFixed(3)} (rounds: ${ratios(pick)
          .map((r) => r.toFixed(2))
          .join(', ')})`,
    )
  }
  console.log(`  broker us/msg per round: base ${fmt(of('base', (m) => m.brokerUs))}; this ${fmt(of('this', (m) => m.brokerUs))}`)
  await Promise.all([base.receiver.stop(), self.receiver.stop(), load.stop()])
}

cleanUpOnInterrupt('both brokers, the receivers and the load')
await runBench(main)

/**
 * hookq beside peer systems with a push worker, in one run on this machine (`npm run bench -- peers`).
 *
 * For each system, the same load pushed to the same webhook sink, end to end: messages/s from the
 * first produce call to the sink having received every message, and the CPU each message cost the
 * worker process (hookq: the broker itself), the server that stores the messages (PostgreSQL: the
 * backends of the round's database plus the server's shared processes; RabbitMQ's beam.smp;
 * nats-server) and, apart, the producer process, all from /proc. Quote the ratios to hookq of the
 * same run, beside "other CPU%" (busy host CPU none of the bench's processes or servers used:
 * another tenant), which says how noisy a round was.
 *
 *   hookq      the broker as `npm start` runs it, a topic of 4 partitions, a group with ackMode auto
 *              and maxInFlight 100 (per partition: up to 400 pushes in flight), the sink its consumer
 *   graphile, pgboss, rabbitmq, nats   graphile-worker 0.18, pg-boss 12, a RabbitMQ quorum queue and a
 *              NATS JetStream file stream, each with a push worker (bench/peers-worker.ts: the settings)
 *   ceiling    bare undici POSTs of push-shaped bodies to the sink, 64 loops for 5 s (bench/e2e-load.ts's
 *              `posts`): what the sink and loopback HTTP take here; its CPU column is that load process's
 * RabbitMQ and NATS are servers the bench finds running; one whose port does not answer is skipped.
 *
 * Fairness: one sink for all (bench/e2e-receiver.ts, counting each message once by its
 * partition/offset); the same value (bench/lib/batches.ts plus the send time); the same producer
 * shape (BENCH_PRODUCERS loops sending batches of BENCH_BATCH through each system's own batch call,
 * bench/peers-produce.ts); up to BENCH_CONCURRENCY (100) POSTs in flight per peer worker; fresh
 * processes and a fresh database (or queue, or stream) for every system and round, systems
 * interleaved within a round, the rounds' medians printed. Differences that remain: hookq POSTs its
 * envelope (about 530 bytes) where the peers POST {partition, offset, value} (about 310); hookq
 * allows 400 in flight, the peers 100; JetStream acks a publish once written to its file store with
 * no fsync per message (the others commit durably before they confirm).
 *
 * The CPU window runs from just before the first produce call until the system has completed every
 * message (hookq: committed offsets; graphile: no job row left; pg-boss: every job completed;
 * RabbitMQ and NATS: every message acked). A system that does not finish within BENCH_MAX_SECONDS
 * reports what completed; one that fails in a round is reported, the others still run.
 *
 * Environment (all optional): BENCH_SYSTEMS=hookq,graphile,pgboss,rabbitmq,nats,ceiling  BENCH_ROUNDS=3
 *   BENCH_MESSAGES=60000 (per system and round: each round starts fresh processes, and at 20,000 a round
 *   is mostly their cold start)  BENCH_PRODUCERS=8  BENCH_BATCH=100  BENCH_CONCURRENCY=100
 *   BENCH_PARTITIONS=4  BENCH_MAX_IN_FLIGHT=100 (hookq's)  BENCH_MAX_SECONDS=60  BENCH_KEEP_DB=1
 *   BENCH_AMQP_URL=amqp://guest:guest@127.0.0.1:5672  BENCH_NATS_URL=nats://127.0.0.1:4222
 */
import { cpus } from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import type { ReceiverStats } from './e2e-receiver.ts'
import { serverSettings } from './lib/db.ts'
import { envInt, SERVER_URL } from './lib/env.ts'
import { type IpcWorker, startIpcWorker } from './lib/ipc.ts'
import { countPostgresDatabases, cpuSince, cpuSnapshot, othersPct, perMessage, processCpuSeconds } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { ceiling as ceilingPosts } from './lib/scenarios.ts'
import { fixed, int, median, table } from './lib/stats.ts'
import type { ProduceResult } from './peers-produce.ts'
import { findServer, type PeerSystem, type SystemConfig, serverVersion, setUp } from './peers-systems.ts'

const LABELS = {
  hookq: 'hookq (ackMode auto)',
  graphile: 'graphile-worker 0.18 + undici push worker',
  pgboss: 'pg-boss 12 + undici push worker',
  rabbitmq: 'RabbitMQ quorum queue + amqplib/undici push worker',
  nats: 'NATS JetStream file stream + nats.js/undici push worker',
  ceiling: 'bare undici POSTs to the sink (the ceiling)',
} as const
type System = keyof typeof LABELS
const SYSTEMS = (process.env.BENCH_SYSTEMS || 'hookq,graphile,pgboss,rabbitmq,nats,ceiling').split(',').map((s) => s.trim()) as System[]
for (const s of SYSTEMS)
  if (!(s in LABELS)) throw new Error(`BENCH_SYSTEMS: unknown system ${s} (known: ${Object.keys(LABELS).join(', ')})`)
const ROUNDS = envInt('BENCH_ROUNDS', 3)
const MESSAGES = envInt('BENCH_MESSAGES', 60_000)
const BATCH = Math.min(1000, envInt('BENCH_BATCH', 100))
const MAX_SECONDS = envInt('BENCH_MAX_SECONDS', 60)
const CFG: SystemConfig = {
  serverUrl: SERVER_URL,
  amqpUrl: process.env.BENCH_AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672',
  natsUrl: process.env.BENCH_NATS_URL || 'nats://127.0.0.1:4222',
  keepDb: Boolean(process.env.BENCH_KEEP_DB),
  producers: envInt('BENCH_PRODUCERS', 8),
  concurrency: envInt('BENCH_CONCURRENCY', 100),
  partitions: envInt('BENCH_PARTITIONS', 4),
  maxInFlight: envInt('BENCH_MAX_IN_FLIGHT', 100),
  pids: {},
}
/** The table's name of a system; hookq's says its topic and group, which the environment may change. */
function label(system: System): string {
  return system === 'hookq' ? `hookq (ackMode auto, ${CFG.partitions} partitions, maxInFlight ${CFG.maxInFlight})` : LABELS[system]
}

const wallNow = () => performance.timeOrigin + performance.now()

cleanUpOnInterrupt('the workers, producers, sink and broker')

// ---- one system, one round

/** CPU seconds of each of `pids` (NaN for a process that is gone). */
const cpuSeconds = (pids: number[]) => pids.map((pid) => processCpuSeconds(pid) ?? NaN)
/** The servers the bench found running (RabbitMQ, NATS), by name for the notes. */
const SERVER_NAMES = { rabbitmq: 'RabbitMQ', nats: 'NATS' } as const
const servers = () => Object.entries(CFG.pids) as [keyof typeof SERVER_NAMES, number][]

async function measure(system: PeerSystem, round: number, receiver: IpcWorker, sinkUrl: string): Promise<RoundResult> {
  const name = `peers-${system}-r${round}`
  const setup = await setUp(system, name, sinkUrl, CFG)
  try {
    const producer = await startIpcWorker('bench/peers-produce.ts', setup.producer, 60_000)
    await receiver.call('scenario', { name, mode: 'count', expect: MESSAGES }, 5000)
    // Another database's backends (a test suite on the same server) are another tenant's CPU, not this system's.
    countPostgresDatabases(setup.database === undefined ? [] : [setup.database])
    await sleep(1000) // let start-up work (first polls, plans) settle before the window
    // Besides the worker and PostgreSQL (cpuSnapshot): producer, sink, the servers found running.
    const pids = [producer.pid, receiver.pid, ...servers().map(([, pid]) => pid)]
    const base = cpuSnapshot(setup.workerPid)
    const base2 = cpuSeconds(pids)
    const deadline = wallNow() + MAX_SECONDS * 1000
    const done = receiver.next<{ at: number }>('done', MAX_SECONDS * 1000 + 5000).catch(() => undefined)
    const r = await producer.call<ProduceResult>(
      'produce',
      { total: MESSAGES, batch: BATCH, maxSeconds: MAX_SECONDS },
      MAX_SECONDS * 1000 + 30_000,
    )
    if (r.produced < MESSAGES) await receiver.call('expect', { n: r.produced }, 5000)
    await Promise.race([done, sleep(Math.max(0, deadline - wallNow()))])
    // The CPU window closes once the system has completed what was produced (or 5 s past the deadline).
    let completed = false
    const completeBy = Math.max(deadline, wallNow()) + 5000
    for (let i = 0; i < 10_000 && !completed && wallNow() < completeBy; i++) {
      completed = await setup.completed(r.produced)
      if (!completed) await sleep(20)
    }
    const completedAt = wallNow()
    const cpu = cpuSince(base, setup.workerPid)
    const [producerS = NaN, receiverS = NaN, ...serversS] = cpuSeconds(pids).map((s, i) => s - base2[i]!)
    const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
    await producer.call('close', {}, 10_000).catch(() => undefined)
    await producer.stop()

    const n = Math.max(1, st.unique)
    const us = perMessage(cpu, n)
    const serverS = serversS[servers().findIndex(([, pid]) => pid === setup.server)]
    const pctOf = (seconds: number) => (100 * seconds) / cpu.seconds
    const finished = Number.isFinite(st.doneAt)
    const seconds = ((finished ? st.doneAt : st.lastUniqueAt) - r.firstSendAt) / 1000
    const idleServers = [
      setup.server === 'postgres' ? '' : `PostgreSQL ${fixed(cpu.postgresPct, 0)}%`,
      ...servers().map(([name, pid], i) => (pid === setup.server ? '' : `${SERVER_NAMES[name]} ${fixed(pctOf(serversS[i]!), 0)}%`)),
    ].filter(Boolean)
    return {
      system,
      round,
      messages: st.unique,
      seconds,
      perS: st.unique / seconds,
      workerUs: us.brokerUs,
      serverUs: setup.server === 'postgres' ? us.postgresUs : ((serverS ?? NaN) * 1e6) / n,
      producerUs: (producerS * 1e6) / n,
      otherPct: othersPct(cpu) - pctOf(producerS + receiverS + serversS.reduce((a, b) => a + b, 0)),
      duplicates: st.duplicates,
      p50: st.latencyMs.p50,
      p99: st.latencyMs.p99,
      notes: [
        finished ? '' : `TIMED OUT after ${MAX_SECONDS} s: the sink got ${int(st.unique)} of ${int(r.produced)} produced`,
        r.timedOut ? `only ${int(r.produced)} of ${int(MESSAGES)} produced` : '',
        r.errors ? `${r.errors} produce calls failed and were sent again` : '',
        completed ? '' : 'NOT all completed in the system by the end of the window',
        `produce ${fixed((r.lastAnswerAt - r.firstSendAt) / 1000, 2)} s (call p99 ${fixed(r.latencyMs.p99, 0)} ms)`,
        finished ? `completed ${fixed((completedAt - st.doneAt) / 1000, 2)} s after the sink had all` : '',
        `the servers not in use: ${idleServers.join(', ')}`,
        st.badBodies ? `${st.badBodies} bodies the sink could not read` : '',
      ]
        .filter(Boolean)
        .join('; '),
    }
  } finally {
    await setup.stop()
  }
}

/** Bare POSTs to the sink from bench/e2e-load.ts's load process: the sink's and loopback HTTP's ceiling. */
async function ceiling(round: number, receiver: IpcWorker, load: IpcWorker, sinkUrl: string): Promise<RoundResult> {
  const pids = [receiver.pid, ...servers().map(([, pid]) => pid)]
  const base = cpuSeconds(pids)
  const r = await ceilingPosts({ receiver, load, receiverUrl: sinkUrl }, `peers-ceiling-r${round}`)
  const countedS = cpuSeconds(pids).reduce((sum, s, i) => sum + s - base[i]!, 0)
  const otherPct = othersPct(r.cpu) - (100 * countedS) / r.cpu.seconds
  return { system: 'ceiling', round, ...r, workerUs: r.loadUs, serverUs: NaN, producerUs: NaN, otherPct }
}

// ---- the report

/** One system's figures in one round. */
interface RoundResult {
  system: string
  round: number
  /** Unique messages the sink received (bare POSTs answered 2xx for the ceiling). */
  messages: number
  seconds: number
  perS: number
  /** CPU per message, us: the worker process (hookq: the broker; ceiling: the load process), the server, the producer. */
  workerUs: number
  serverUs: number
  producerUs: number
  /** Busy CPU of the host not counted to any process of the bench or to a server, % of one core. */
  otherPct: number
  duplicates: number
  p50: number
  p99: number
  notes: string
}

const x = (n: number) => (Number.isFinite(n) ? `${n.toFixed(2)}x` : '-')

/** One round of one system, as it finishes. */
const roundLine = (r: RoundResult) =>
  `round ${r.round} ${r.system}: ${int(r.perS)} msg/s (${int(r.messages)} in ${fixed(r.seconds, 2)} s); CPU per message: ` +
  `worker ${fixed(r.workerUs, 0)} us, server ${fixed(r.serverUs, 0)} us, producer ${fixed(r.producerUs, 0)} us; ` +
  `p50/p99 ${fixed(r.p50, 1)}/${fixed(r.p99, 1)} ms; duplicates ${r.duplicates}; other CPU ${fixed(r.otherPct, 0)}%` +
  (r.notes ? `\n  ${r.notes}` : '')

/** The medians per system over the rounds (total: the median of the rounds' totals), with the ratios to hookq's. */
function mediansTable(rows: RoundResult[], systems: System[]): string {
  const med = (s: string, f: (r: RoundResult) => number) => median(rows.filter((r) => r.system === s).map(f))
  const total = (r: RoundResult) => r.workerUs + r.serverUs
  const head = ['system', 'msg/s', 'msg/s, ratio to hookq', 'CPU us/msg: worker or broker', 'server', 'total', 'total, ratio to hookq']
  head.push('producer us/msg', 'p99 ms', 'dups', 'other CPU% (max)')
  const body = systems
    .filter((system) => rows.some((r) => r.system === system))
    .map((system) => {
      const peer = (s: string) => (system === 'ceiling' ? '' : s)
      const others = rows.filter((r) => r.system === system).map((r) => r.otherPct)
      return [
        label(system),
        int(med(system, (r) => r.perS)),
        x(med(system, (r) => r.perS) / med('hookq', (r) => r.perS)),
        fixed(
          med(system, (r) => r.workerUs),
          0,
        ),
        peer(
          fixed(
            med(system, (r) => r.serverUs),
            0,
          ),
        ),
        peer(fixed(med(system, total), 0)),
        peer(x(med(system, total) / med('hookq', total))),
        peer(
          fixed(
            med(system, (r) => r.producerUs),
            0,
          ),
        ),
        fixed(
          med(system, (r) => r.p99),
          1,
        ),
        int(rows.filter((r) => r.system === system).reduce((n, r) => n + r.duplicates, 0)),
        `${fixed(median(others), 0)} (${fixed(Math.max(...others), 0)})`,
      ]
    })
  return table(head, body)
}

// ---- the run

async function main(): Promise<void> {
  const started = Date.now()
  const settings = await serverSettings(CFG.serverUrl)
  let systems = SYSTEMS
  const versions: string[] = []
  for (const [system, url, port] of [
    ['rabbitmq', CFG.amqpUrl, 5672],
    ['nats', CFG.natsUrl, 4222],
  ] as const) {
    if (!systems.includes(system)) continue
    const found = await findServer(url, port)
    if ('skip' in found) {
      console.log(`${system} skipped: ${found.skip}`)
      systems = systems.filter((s) => s !== system)
      continue
    }
    CFG.pids[system] = found.pid
    versions.push(`${system} ${await serverVersion(system, url)} (pid ${found.pid})`)
  }
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: 'http://127.0.0.1:9' }, 30_000)
  const sinkUrl = `http://127.0.0.1:${receiver.ready.port as number}`
  const load = systems.includes('ceiling') ? await startIpcWorker('bench/e2e-load.ts', {}, 30_000) : undefined

  console.log(
    `peers bench: ${systems.join(', ')}; ${ROUNDS} rounds; ${int(MESSAGES)} messages per system and round from ${CFG.producers} producers ` +
      `in batches of ${BATCH}; peer workers ${CFG.concurrency} POSTs in flight (pg-boss: fetched in batches of as many); ` +
      `hookq ${CFG.partitions} partitions, maxInFlight ${CFG.maxInFlight}`,
  )
  console.log(
    `PostgreSQL ${settings.server_version} at ${new URL(CFG.serverUrl).host}: fsync=${settings.fsync} synchronous_commit=${settings.synchronous_commit} ` +
      `max_connections=${settings.max_connections}; ${versions.join('; ') || 'no other server'}; sink pid ${receiver.pid} at ${sinkUrl}`,
  )
  const idle = cpuSnapshot(undefined)
  await sleep(1000)
  const background = cpuSince(idle, undefined)
  console.log(
    `host: ${cpus().length} cores, ${fixed(background.hostPct * background.cores, 0)}% of one core busy before the run ` +
      `(PostgreSQL ${fixed(background.postgresPct, 0)}%)\n`,
  )

  const rows: RoundResult[] = []
  const failures: string[] = []
  for (let round = 1; round <= ROUNDS; round++) {
    for (const system of systems) {
      try {
        const r = system === 'ceiling' ? await ceiling(round, receiver, load!, sinkUrl) : await measure(system, round, receiver, sinkUrl)
        rows.push(r)
        console.log(roundLine(r))
      } catch (err) {
        if (run.interrupted) return
        const msg = err instanceof Error ? (err.stack ?? err.message) : String(err)
        failures.push(`round ${round} ${system}: ${msg}`)
        console.error(`round ${round} ${system} FAILED: ${msg}`)
      }
    }
  }

  console.log(`\nmedians of ${ROUNDS} rounds (${new Date().toISOString().slice(0, 10)}):\n` + `${mediansTable(rows, systems)}\n`)
  console.log(
    `msg/s: unique messages the sink received / (the time it had them all - the first produce call); ceiling: 2xx answers/s.\n` +
      `CPU per message, from /proc, over the window from the first produce call to the system having completed every message:\n` +
      `  worker or broker = hookq's broker process, or the peer's worker process; ceiling: the load process, per bare POST;\n` +
      `  server = PostgreSQL (the backends of the round's database and the server's shared processes), or the RabbitMQ or NATS server;\n` +
      `  total = worker + server; producer = the producer process, not in the total.\n` +
      `p99 ms: the produce call's send time -> the sink's receipt, under full load (ceiling: the POST's round trip).\n` +
      `other CPU% = busy host CPU (% of one core; ${cpus().length * 100}% = all) used by none of the bench's processes and none of the servers' (the\n` +
      `  backends of other databases included): another tenant. A round with much of it is a noisy one.`,
  )
  await Promise.all([receiver.stop(), load?.stop()])
  console.log(`\nwhole run ${((Date.now() - started) / 1000).toFixed(0)} s`)
  if (failures.length) throw new Error(`${failures.length} system rounds failed:\n${failures.join('\n')}`)
}

await runBench(main)

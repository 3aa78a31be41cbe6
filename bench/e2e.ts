/**
 * End-to-end push delivery of hookq against the local PostgreSQL (`npm run bench:e2e`).
 *
 * A fresh database, the broker as a child process on it, a webhook receiver (bench/e2e-receiver.ts:
 * node:http, answers 200 at once) and a load process (bench/e2e-load.ts), each its own process:
 *
 *   ceiling   bare undici POSTs of push-shaped bodies from the load process to the receiver
 *             (keep-alive Agent, 64 loops), for a fixed time: what the receiver and loopback HTTP
 *             take on this machine, the reference for the push rates below. Twice: with request()
 *             as the broker's pusher uses it, and with a bare dispatch() handler (the client's CPU
 *             per request of each is the floor of the broker's cost per push)
 *   produce   the same produce load as `auto` to a topic no group reads: the broker's CPU per
 *             message for produce alone, to split the end-to-end cost into produce and push
 *   auto      produce BENCH_MESSAGES messages (batches of 100, 4 producer loops) to a topic of 8
 *             partitions with a group in ackMode auto: messages/s from the first produce call to
 *             the last message completed (committed offsets read back from GET /v1/groups/{g}),
 *             produce included, the broker's CPU, duplicates seen by the receiver
 *   batch10, batch100  the `auto` load and group with batch push of up to 10 / 100 messages a POST
 *   drain, drain-batch10, drain-batch100  BENCH_MESSAGES produced to a paused group (auto mode; single
 *             pushes, batches of 10, of 100), then unpaused: the push path alone, from the unpause to
 *             the last completion, where the scenarios above are bounded by how fast produce runs
 *   filtered  the `auto` load and group with a filter that keeps 1 message in BENCH_FILTER_KEEP_EVERY (10):
 *             the cost of a filtered message (broker us per produced message, beside produce and auto)
 *   explicit  the same with ackMode explicit: the receiver acks over HTTP like a consumer library,
 *             batching delivery ids (500 ids or 5 ms, 4 ack calls at most at once)
 *   latency   single-message produce calls paced at 5,000/s for 10 s (after a 2 s warm-up), ackMode
 *             auto: p50/p99 from the producer's send time (in the message value) to the push's
 *             arrival at the receiver; both processes read the same wall clock. Then the same at
 *             500/s, a rate the broker sustains here, for the latency of the path itself.
 *
 * Prints the figures beside the goals and, with BENCH_CPU_PROF=1, the broker's top functions per
 * scenario (a profile over exactly that scenario, taken through the inspector). Exits non-zero
 * only when the run itself fails, never for a missed goal. Every load loop is bounded in count and
 * time; a throughput scenario that does not finish within BENCH_MAX_SECONDS reports what completed.
 *
 * Environment (all optional):
 *   BENCH_SCENARIOS=ceiling,produce,auto,explicit,latency (batch*, drain*, filtered: not run unless named)
 *   BENCH_FILTER_KEEP_EVERY=10  the filtered scenario pushes one message in this many
 *   BENCH_MESSAGES=100000       messages per throughput scenario
 *   BENCH_PRODUCE_MESSAGES=30000  messages of the produce-only scenario
 *   BENCH_WARMUP_MESSAGES=20000   an auto run before the measured scenarios, reported apart (0: none): the JIT's start-up
 *   BENCH_BATCH=100             messages per produce call (throughput scenarios)
 *   BENCH_PRODUCERS=4           concurrent produce loops
 *   BENCH_PARTITIONS=8
 *   BENCH_MAX_IN_FLIGHT=200     the groups' maxInFlight (per partition)
 *   BENCH_MAX_SECONDS=30        cap on one throughput scenario
 *   BENCH_CEILING_SECONDS=5     measured seconds of the bare POST ceiling (after 1 s warm-up)
 *   BENCH_CEILING_CONCURRENCY=64
 *   BENCH_CEILING_DISPATCH=0    skip the second ceiling, through undici's bare dispatch() instead of request()
 *   BENCH_RATES=5000,500        messages/s of the latency scenarios (the goal is judged at the first)
 *   BENCH_LATENCY_SECONDS=10    measured seconds of each latency scenario (after BENCH_LATENCY_WARMUP_SECONDS=2)
 *   BENCH_LATENCY_CONNECTIONS=64  the paced producer's keep-alive connections (one call at a time on each)
 *   BENCH_ACK_BATCH=500  BENCH_ACK_FLUSH_MS=5  BENCH_ACK_CONCURRENCY=4
 *   BENCH_TRACEPARENT=1         every produced message carries a traceparent header of its own (trace context's cost)
 *   BENCH_CONSUMER_AUTH=none    every consumer's push authentication: none, headers or jwt
 *   BENCH_PG_WAITS=0            do not sample pg_stat_activity during the throughput scenarios
 *   BENCH_CPU_PROF=1            profile the broker per scenario (bench/out/e2e-*.cpuprofile)
 *   BENCH_HEAP_PROF=1           sample the broker's allocations per scenario instead (bench/out/e2e-*.heapprofile):
 *                               bytes allocated per message, by function, module and nearest src/ caller
 *   BENCH_DATABASE_URL=...      server to create the bench database on (default postgres@127.0.0.1:5432)
 *   BENCH_BROKER_NODE_OPTIONS, BENCH_BROKER_NODE_ARGS  node flags for the broker alone (the second for V8
 *                               flags NODE_OPTIONS refuses, such as --single-threaded-gc)
 *   BENCH_BROKER_LOG=<file>     append all the broker prints to the file (with BENCH_BROKER_NODE_ARGS=--trace-gc, say)
 *   HOOKQ_*                     passed to the broker
 */
import { mkdirSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { brokerApi, startBroker, stopBroker } from './lib/broker.ts'
import { ROOT } from './lib/child.ts'
import { formatSummary, inclusiveTimes, summarizeProfile } from './lib/cpuprofile.ts'
import { createBenchDatabase, serverSettings } from './lib/db.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { startHeapSampling, startProfile, type WindowProfiler } from './lib/inspector.ts'
import { formatAllocations, summarizeAllocations } from './lib/heapprofile.ts'
import { startIpcWorker, type IpcWorker } from './lib/ipc.ts'
import { sampleWaits, type WaitSampler } from './lib/pgwaits.ts'
import { cpuSince, cpuSnapshot, processCpuSeconds, type CpuWindow } from './lib/proc.ts'
import type { ReceiverStats } from './e2e-receiver.ts'
import { envCount, envNumber } from './lib/env.ts'

const SCENARIOS = new Set((process.env.BENCH_SCENARIOS || 'ceiling,produce,auto,explicit,latency').split(',').map((s) => s.trim()))
for (const s of SCENARIOS)
  if (
    ![
      'ceiling',
      'produce',
      'auto',
      'batch10',
      'batch100',
      'drain',
      'drain-batch10',
      'drain-batch100',
      'filtered',
      'explicit',
      'latency',
    ].includes(s)
  )
    throw new Error(`BENCH_SCENARIOS: unknown scenario ${s}`)
const MESSAGES = Math.round(envNumber('BENCH_MESSAGES', 100_000))
const PRODUCE_MESSAGES = Math.round(envNumber('BENCH_PRODUCE_MESSAGES', 30_000))
const WARMUP_MESSAGES = envCount('BENCH_WARMUP_MESSAGES', 20_000)
const BATCH = Math.min(1000, Math.round(envNumber('BENCH_BATCH', 100)))
const KEEP_EVERY = Math.max(1, Math.round(envNumber('BENCH_FILTER_KEEP_EVERY', 10)))
const PRODUCERS = Math.round(envNumber('BENCH_PRODUCERS', 4))
const PARTITIONS = Math.round(envNumber('BENCH_PARTITIONS', 8))
const MAX_IN_FLIGHT = Math.round(envNumber('BENCH_MAX_IN_FLIGHT', 200))
const MAX_SECONDS = envNumber('BENCH_MAX_SECONDS', 30)
const CEILING_S = envNumber('BENCH_CEILING_SECONDS', 5)
const CEILING_CONCURRENCY = Math.round(envNumber('BENCH_CEILING_CONCURRENCY', 64))
const CEILING_DISPATCH = process.env.BENCH_CEILING_DISPATCH !== '0'
const RATES = (process.env.BENCH_RATES || '5000,500').split(',').map((r) => {
  const n = Number(r)
  if (!Number.isFinite(n) || n <= 0) throw new Error(`BENCH_RATES: "${r}" is not a positive number`)
  return n
})
const RATE = RATES[0]!
const LATENCY_S = envNumber('BENCH_LATENCY_SECONDS', 10)
const LATENCY_WARMUP_S = envNumber('BENCH_LATENCY_WARMUP_SECONDS', 2)
const ACK = {
  ackBatch: Math.min(1000, Math.round(envNumber('BENCH_ACK_BATCH', 500))),
  ackFlushMs: envNumber('BENCH_ACK_FLUSH_MS', 5),
  ackConcurrency: Math.round(envNumber('BENCH_ACK_CONCURRENCY', 4)),
}
const PG_WAITS = process.env.BENCH_PG_WAITS !== '0'
const CPU_PROF = process.env.BENCH_CPU_PROF === '1'
const HEAP_PROF = !CPU_PROF && process.env.BENCH_HEAP_PROF === '1'
const PROF_DIR = 'bench/out'
const SERVER_URL = process.env.BENCH_DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
/**
 * Issue 10's goals: shares of the same run's bare request() ceiling (15,000 msg/s when the ceiling
 * is 25,000), and its budget per message in auto mode; the p99 at 5,000 msg/s from the latency work.
 */
const GOALS = { autoCeilingRatio: 0.6, explicitCeilingRatio: 0.45, brokerUs: 50, postgresUs: 40, p99Ms: 10 }

const wallNow = () => performance.timeOrigin + performance.now()

// ---- cleanup: the bench database and the processes this run started, also on failure and Ctrl-C

cleanUpOnInterrupt('the load, the receiver and the broker')

// ---- formatting

const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '-')
const fixed = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : '-')

// ---- CPU over a window: broker, PostgreSQL, receiver, load process, host

interface Cpu extends CpuWindow {
  receiverPct: number
  loadPct: number
  brokerS: number
}
interface CpuStart {
  base: ReturnType<typeof cpuSnapshot>
  receiver: number
  load: number
}

function cpuStart(receiver: IpcWorker, load: IpcWorker): CpuStart {
  return { base: cpuSnapshot(run.broker!.pid), receiver: processCpuSeconds(receiver.pid) ?? NaN, load: processCpuSeconds(load.pid) ?? NaN }
}
function cpuEnd(start: CpuStart, receiver: IpcWorker, load: IpcWorker): Cpu {
  const w = cpuSince(start.base, run.broker!.pid)
  const pct = (a: number, b: number | undefined) => (100 * ((b ?? NaN) - a)) / w.seconds
  return {
    ...w,
    receiverPct: pct(start.receiver, processCpuSeconds(receiver.pid)),
    loadPct: pct(start.load, processCpuSeconds(load.pid)),
    brokerS: (w.brokerPct * w.seconds) / 100,
  }
}
/** Busy host CPU not accounted to the broker, PostgreSQL, receiver, load or this process: other tenants. */
const otherPct = (c: Cpu) => c.hostPct * c.cores - c.brokerPct - c.postgresPct - c.receiverPct - c.loadPct - c.selfPct

// ---- the broker's API

function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  return brokerApi<T>(run.broker!.url, method, path, body)
}

interface GroupStatus {
  partitions: { committedOffset: number; endOffset: number; lag: number; inFlight: number }[]
}

/** Polls the group until `expected` messages are completed (sum of committed offsets); the wall time it saw that, or NaN at the deadline. */
async function waitCompleted(group: string, expected: number, deadlineMs: number): Promise<{ at: number; completed: number }> {
  let completed = 0
  for (let i = 0; i < 100_000 && wallNow() < deadlineMs; i++) {
    const s = await api<GroupStatus>('GET', `/v1/groups/${group}`)
    completed = s.partitions.reduce((n, p) => n + p.committedOffset, 0)
    if (completed >= expected) return { at: wallNow(), completed }
    await sleep(10)
  }
  return { at: NaN, completed }
}

async function createGroup(name: string, ackMode: 'auto' | 'explicit', receiverUrl: string, extra: object = {}): Promise<void> {
  await api('PUT', `/v1/topics/${name}`, { partitions: PARTITIONS })
  await api('PUT', `/v1/groups/${name}`, {
    topic: name,
    ackMode,
    maxInFlight: MAX_IN_FLIGHT,
    ackTimeoutMs: 30_000,
    pushTimeoutMs: 10_000,
    ...extra,
  })
  await api('POST', `/v1/groups/${name}/consumers`, { url: `${receiverUrl}/p/${name}`, ...consumerAuth() })
}

/** BENCH_CONSUMER_AUTH=none|headers|jwt: the push authentication of every consumer (what it costs per push). */
function consumerAuth(): object {
  const kind = process.env.BENCH_CONSUMER_AUTH || 'none'
  if (kind === 'none') return {}
  if (kind === 'headers') return { auth: { type: 'headers', headers: { 'x-api-key': 'bench-key-0123456789' } } }
  if (kind === 'jwt') return { auth: { type: 'jwt' } }
  throw new Error(`BENCH_CONSUMER_AUTH: none, headers or jwt, got ${kind}`)
}

/** After a scenario: no more pushes from its group (a backlog left by a timed-out run would disturb the next). */
async function pauseGroup(name: string, ackMode: 'auto' | 'explicit'): Promise<void> {
  await api('PUT', `/v1/groups/${name}`, {
    topic: name,
    ackMode,
    maxInFlight: MAX_IN_FLIGHT,
    ackTimeoutMs: 30_000,
    pushTimeoutMs: 10_000,
    paused: true,
  })
}

function assertBrokerAlive(during: string): void {
  if (run.broker!.child.exitCode !== null || run.broker!.child.signalCode !== null)
    throw new Error(`the broker died during ${during}:\n${run.broker!.output()}`)
}

// ---- profiles

interface Profiled {
  scenario: string
  file: string
  messages: number
}
const profiles: Profiled[] = []

async function profileStart(): Promise<WindowProfiler | undefined> {
  if (CPU_PROF) return startProfile(run.broker!.inspectorUrl!)
  if (HEAP_PROF) return startHeapSampling(run.broker!.inspectorUrl!)
  return undefined
}
async function profileStop(p: WindowProfiler | undefined, scenario: string, messages: number): Promise<void> {
  if (!p) return
  mkdirSync(join(ROOT, PROF_DIR), { recursive: true })
  const ext = CPU_PROF ? 'cpuprofile' : 'heapprofile'
  const file = join(ROOT, PROF_DIR, `e2e-${scenario}-${new Date().toISOString().replace(/[:.]/g, '')}.${ext}`)
  await p.stop(file)
  profiles.push({ scenario, file, messages })
}

function startWaits(): Promise<WaitSampler | undefined> {
  return PG_WAITS ? sampleWaits(SERVER_URL, run.db!.name).catch(() => undefined) : Promise.resolve(undefined)
}
async function stopWaits(s: Promise<WaitSampler | undefined>): Promise<string | undefined> {
  const w = await (await s)?.stop().catch(() => undefined)
  if (!w) return undefined
  return (
    `pg backends, average count by state (${w.samples} samples): ` +
    (w.avg
      .filter(([, n]) => n >= 0.05)
      .map(([what, n]) => `${what} ${n.toFixed(2)}`)
      .join(', ') || 'all idle')
  )
}

// ---- scenarios

interface Row {
  label: string
  /** Ceilings: the load process's CPU per request, us. */
  clientUsPerReq?: number
  messages: number
  seconds: number
  perS: number
  p50: number
  p99: number
  cpu: Cpu
  duplicates: number
  notes: string
}

interface PostsResult {
  ok: number
  errors: number
  non2xx: Record<string, number>
  seconds: number
  latencyMs: { p50: number; p99: number; max: number }
  sent: number
}
interface BulkResult {
  produced: number
  requests: number
  non201: Record<string, number>
  errors: number
  retries: number
  firstSendAt: number
  lastAnswerAt: number
  timedOut: boolean
  latencyMs: { p50: number; p99: number; max: number }
}
interface PacedResult {
  sent: number
  produced: number
  producedMeasured: number
  errors: number
  non201: Record<string, number>
  scheduled: number
  firstSendAt: number
  lastSendAt: number
  achievedRate: number
  maxOutstanding: number
  cappedTicks: number
  maxBehind: number
  produceLatencyMs: { p50: number; p99: number; max: number }
}

const codes = (m: Record<string, number>) =>
  Object.entries(m)
    .map(([c, n]) => `${c}:${n}`)
    .join(' ')

async function ceiling(api: 'request' | 'dispatch', receiver: IpcWorker, load: IpcWorker, receiverUrl: string): Promise<Row> {
  await receiver.call('scenario', { name: `ceiling-${api}`, mode: 'count', expect: 0 }, 5000)
  const c0 = cpuStart(receiver, load)
  const r = await load.call<PostsResult>(
    'posts',
    {
      url: `${receiverUrl}/p/ceiling-${api}`,
      concurrency: CEILING_CONCURRENCY,
      warmupS: 1,
      measureS: CEILING_S,
      maxRequests: 5_000_000,
      api,
    },
    (CEILING_S + 30) * 1000,
  )
  const cpu = cpuEnd(c0, receiver, load)
  const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
  const bad = r.errors + Object.values(r.non2xx).reduce((a, b) => a + b, 0)
  return {
    clientUsPerReq: (1e4 * cpu.loadPct * cpu.seconds) / Math.max(1, r.sent),
    label: `ceiling: bare POSTs, undici ${api === 'request' ? 'request()' : 'dispatch()'}, ${CEILING_CONCURRENCY} loops`,
    messages: r.ok,
    seconds: r.seconds,
    perS: r.ok / r.seconds,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    cpu,
    duplicates: st.duplicates,
    notes:
      `round trip p50/p99; receiver got ${int(st.unique)} of ${int(r.sent)} sent; receiver ${fixed((1e4 * cpu.receiverPct * cpu.seconds) / Math.max(1, st.pushes), 0)} us CPU/request, ` +
      `load ${fixed((1e4 * cpu.loadPct * cpu.seconds) / Math.max(1, r.sent), 0)} us/request${bad ? `; failed ${bad} ${codes(r.non2xx)}` : ''}`,
  }
}

async function produceOnly(receiver: IpcWorker, load: IpcWorker): Promise<Row> {
  const name = 'e2e-produce'
  await api('PUT', `/v1/topics/${name}`, { partitions: PARTITIONS })
  await sleep(300)
  const profiler = await profileStart()
  const c0 = cpuStart(receiver, load)
  const r = await load.call<BulkResult>(
    'bulk',
    {
      url: `${run.broker!.url}/v1/topics/${name}/messages`,
      total: PRODUCE_MESSAGES,
      batch: BATCH,
      concurrency: PRODUCERS,
      maxSeconds: MAX_SECONDS,
    },
    MAX_SECONDS * 1000 + 60_000,
  )
  const cpu = cpuEnd(c0, receiver, load)
  await profileStop(profiler, 'produce', PRODUCE_MESSAGES)
  assertBrokerAlive('produce')
  const seconds = (r.lastAnswerAt - r.firstSendAt) / 1000
  return {
    label: `produce only: ${int(PRODUCE_MESSAGES)} msgs, no group`,
    messages: r.produced,
    seconds,
    perS: r.produced / seconds,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    cpu,
    duplicates: 0,
    notes: [
      `produce call p50/p99, batches of ${BATCH}`,
      r.timedOut ? `TIMED OUT: ${int(r.produced)} of ${int(PRODUCE_MESSAGES)} produced` : '',
      r.retries ? `retries ${r.retries} ${codes(r.non201)}` : '',
    ]
      .filter(Boolean)
      .join('; '),
  }
}

async function throughput(
  mode: 'auto' | 'explicit' | 'filtered' | 'batch10' | 'batch100',
  receiver: IpcWorker,
  load: IpcWorker,
  receiverUrl: string,
  { warmup = false, messages = MESSAGES }: { warmup?: boolean; messages?: number } = {},
): Promise<Row & { waits?: string | undefined }> {
  const name = warmup ? 'e2e-warmup' : `e2e-${mode}`
  const ackMode = mode === 'explicit' ? 'explicit' : 'auto'
  const filtered = mode === 'filtered'
  const pushed = (produced: number) => (filtered ? Math.ceil(produced / BATCH) * Math.ceil(BATCH / KEEP_EVERY) : produced)
  const batch = mode === 'batch10' ? 10 : mode === 'batch100' ? 100 : undefined
  await createGroup(
    name,
    ackMode,
    receiverUrl,
    filtered ? { filter: { 'headers.keep': 'yes' } } : batch ? { batch: { maxMessages: batch } } : {},
  )
  await receiver.call('scenario', { name, mode: ackMode === 'auto' ? 'count' : 'ack', expect: pushed(messages), group: name, ...ACK }, 5000)
  await sleep(500) // let the group's start-up reads settle
  const profiler = warmup ? undefined : await profileStart()
  const waits = startWaits()
  const c0 = cpuStart(receiver, load)
  const startedAt = wallNow()
  const deadline = startedAt + MAX_SECONDS * 1000
  const done = receiver.next<{ at: number }>('done', MAX_SECONDS * 1000 + 5000).catch(() => undefined)
  const r = await load.call<BulkResult>(
    'bulk',
    {
      url: `${run.broker!.url}/v1/topics/${name}/messages`,
      total: messages,
      batch: BATCH,
      concurrency: PRODUCERS,
      maxSeconds: MAX_SECONDS,
      ...(filtered ? { keepEvery: KEEP_EVERY } : {}),
    },
    MAX_SECONDS * 1000 + 60_000,
  )
  if (r.produced < messages) await receiver.call('expect', { n: pushed(r.produced) }, 5000)
  await Promise.race([done, sleep(Math.max(0, deadline - wallNow()))])
  const completed = await waitCompleted(name, r.produced, Math.max(deadline, wallNow() + 2000))
  const cpu = cpuEnd(c0, receiver, load)
  const waited = await stopWaits(waits)
  await profileStop(profiler, mode, completed.completed)
  await pauseGroup(name, ackMode)
  assertBrokerAlive(mode)
  const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
  const finished = Number.isFinite(completed.at)
  const endAt = finished ? completed.at : wallNow()
  const seconds = (endAt - r.firstSendAt) / 1000
  const notes = [
    finished ? '' : `TIMED OUT after ${MAX_SECONDS} s: ${int(completed.completed)} of ${int(r.produced)} completed`,
    r.produced < messages ? `only ${int(r.produced)} of ${int(messages)} produced` : '',
    `produce ${fixed((r.lastAnswerAt - r.firstSendAt) / 1000, 2)} s (${int(r.produced / ((r.lastAnswerAt - r.firstSendAt) / 1000))}/s, call p99 ${fixed(r.latencyMs.p99, 0)} ms)`,
    finished
      ? `all pushed +${fixed((st.lastUniqueAt - r.lastAnswerAt) / 1000, 2)} s after the last produce answer, completed +${fixed((endAt - st.lastUniqueAt) / 1000, 2)} s after that`
      : `${int(st.unique)} pushed by the end`,
    r.retries ? `produce retries ${r.retries} ${codes(r.non201)}` : '',
    st.acks
      ? `acks: ${st.acks.calls} calls, ${codes(st.acks.statuses)}, call p99 ${fixed(st.acks.callMs.p99, 0)} ms${st.acks.errors ? `, errors ${st.acks.errors}` : ''}`
      : '',
  ]
    .filter(Boolean)
    .join('; ')
  return {
    label: `${mode}: ${int(messages)} msgs, ${PARTITIONS} partitions, maxInFlight ${MAX_IN_FLIGHT}${filtered ? `, 1 in ${KEEP_EVERY} pushed` : ''}`,
    messages: completed.completed,
    seconds,
    perS: completed.completed / seconds,
    p50: st.latencyMs.p50,
    p99: st.latencyMs.p99,
    cpu,
    duplicates: st.duplicates,
    notes,
    waits: waited,
  }
}

/** A backlog pushed to a consumer: produced while the group is paused, timed from the unpause. */
async function drain(batch: number | undefined, receiver: IpcWorker, load: IpcWorker, receiverUrl: string): Promise<Row> {
  const name = `e2e-drain${batch ? `-b${batch}` : ''}`
  const settings = { ...(batch ? { batch: { maxMessages: batch } } : {}) }
  await createGroup(name, 'auto', receiverUrl, { ...settings, paused: true })
  await receiver.call('scenario', { name, mode: 'count', expect: MESSAGES, group: name }, 5000)
  const r = await load.call<BulkResult>(
    'bulk',
    {
      url: `${run.broker!.url}/v1/topics/${name}/messages`,
      total: MESSAGES,
      batch: BATCH,
      concurrency: PRODUCERS,
      maxSeconds: MAX_SECONDS,
    },
    MAX_SECONDS * 1000 + 60_000,
  )
  if (r.produced < MESSAGES) await receiver.call('expect', { n: r.produced }, 5000)
  await sleep(500)
  const profiler = await profileStart()
  const c0 = cpuStart(receiver, load)
  const startedAt = wallNow()
  const done = receiver.next<{ at: number }>('done', MAX_SECONDS * 1000 + 5000).catch(() => undefined)
  await api('PUT', `/v1/groups/${name}`, {
    topic: name,
    ackMode: 'auto',
    maxInFlight: MAX_IN_FLIGHT,
    ackTimeoutMs: 30_000,
    pushTimeoutMs: 10_000,
    ...settings,
    paused: false,
  })
  await Promise.race([done, sleep(MAX_SECONDS * 1000)])
  const completed = await waitCompleted(name, r.produced, wallNow() + 5000)
  const cpu = cpuEnd(c0, receiver, load)
  await profileStop(profiler, name.slice(4), completed.completed)
  await pauseGroup(name, 'auto')
  assertBrokerAlive(name)
  const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
  const finished = Number.isFinite(completed.at)
  const seconds = ((finished ? completed.at : wallNow()) - startedAt) / 1000
  return {
    label: `drain: backlog of ${int(r.produced)}, ${batch ? `batches of ${batch}` : 'single pushes'}`,
    messages: completed.completed,
    seconds,
    perS: completed.completed / seconds,
    p50: NaN,
    p99: NaN,
    cpu,
    duplicates: st.duplicates,
    notes: finished ? `${int(st.pushes)} POSTs` : `TIMED OUT: ${int(completed.completed)} of ${int(r.produced)} completed`,
  }
}

async function latency(rate: number, receiver: IpcWorker, load: IpcWorker, receiverUrl: string): Promise<Row & { achievedRate: number }> {
  const name = `e2e-latency-${rate}`
  await createGroup(name, 'auto', receiverUrl)
  await receiver.call('scenario', { name, mode: 'count', expect: 0 }, 5000)
  await sleep(500)
  const profiler = await profileStart()
  const c0 = cpuStart(receiver, load)
  const done = receiver.next<{ at: number }>('done', (LATENCY_WARMUP_S + LATENCY_S + 30) * 1000).catch(() => undefined)
  const r = await load.call<PacedResult>(
    'paced',
    {
      url: `${run.broker!.url}/v1/topics/${name}/messages`,
      rate,
      warmupS: LATENCY_WARMUP_S,
      measureS: LATENCY_S,
      maxOutstanding: 2000,
      connections: Math.round(envNumber('BENCH_LATENCY_CONNECTIONS', 64)),
    },
    (LATENCY_WARMUP_S + LATENCY_S + 60) * 1000,
  )
  await receiver.call('expect', { n: r.produced }, 5000)
  await Promise.race([done, sleep(10_000)])
  const completed = await waitCompleted(name, r.produced, wallNow() + 10_000)
  const cpu = cpuEnd(c0, receiver, load)
  await profileStop(profiler, `latency-${rate}`, completed.completed)
  await pauseGroup(name, 'auto')
  assertBrokerAlive(`latency at ${rate}/s`)
  const st = await receiver.call<ReceiverStats>('stats', {}, 5000)
  const failed = r.errors + Object.values(r.non201).reduce((a, b) => a + b, 0)
  const notes = [
    `sent ${fixed(r.achievedRate / 1000, 2)}k/s${r.sent < r.scheduled ? ` (${int(r.scheduled - r.sent)} of ${int(r.scheduled)} not sent by the end)` : ''}`,
    `produce call p50/p99 ${fixed(r.produceLatencyMs.p50, 2)}/${fixed(r.produceLatencyMs.p99, 2)} ms`,
    `push max ${fixed(st.latencyMs.max, 1)} ms`,
    `${int(st.latencyCount)} measured`,
    `outstanding max ${r.maxOutstanding}${r.cappedTicks ? `, capped ${r.cappedTicks} ticks` : ''}`,
    failed ? `produce failed ${failed} ${codes(r.non201)}` : '',
    Number.isFinite(completed.at) ? '' : `NOT COMPLETED: ${int(completed.completed)} of ${int(r.produced)}`,
  ]
    .filter(Boolean)
    .join('; ')
  return {
    label: `latency: 1 msg/call at ${int(rate)}/s for ${LATENCY_S} s, auto`,
    messages: r.produced,
    seconds: (r.lastSendAt - r.firstSendAt) / 1000,
    perS: r.produced / ((r.lastSendAt - r.firstSendAt) / 1000),
    p50: st.latencyMs.p50,
    p99: st.latencyMs.p99,
    cpu,
    duplicates: st.duplicates,
    notes,
    achievedRate: r.achievedRate,
  }
}

function table(rows: Row[]): string {
  const head = [
    'scenario',
    'msg/s',
    'seconds',
    'p50 ms',
    'p99 ms',
    'broker CPU%',
    'broker us/msg',
    'msg/s per broker core',
    'pg CPU%',
    'recv CPU%',
    'load CPU%',
    'other CPU%',
    'dups',
  ]
  const body = rows.map((r) => {
    const usPerMsg = r.label.startsWith('ceiling') ? NaN : (1e6 * r.cpu.brokerS) / Math.max(1, r.messages)
    return [
      r.label,
      int(r.perS),
      fixed(r.seconds, 2),
      fixed(r.p50, 2),
      fixed(r.p99, 2),
      fixed(r.cpu.brokerPct, 0),
      fixed(usPerMsg, 0),
      int(1e6 / usPerMsg),
      fixed(r.cpu.postgresPct, 0),
      fixed(r.cpu.receiverPct, 0),
      fixed(r.cpu.loadPct, 0),
      fixed(otherPct(r.cpu), 0),
      int(r.duplicates),
    ]
  })
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n')
}

const brokerUs = (r: Row) => (1e6 * r.cpu.brokerS) / Math.max(1, r.messages)
const postgresUs = (r: Row) => (1e4 * r.cpu.postgresPct * r.cpu.seconds) / Math.max(1, r.messages)

function goals(
  ceil: Row | undefined,
  ceilDispatch: Row | undefined,
  auto: Row | undefined,
  explicit: Row | undefined,
  lat: (Row & { achievedRate: number }) | undefined,
): string {
  const ratio = (r: Row, c: Row) => r.perS / c.perS
  const lines: [string, string, string, boolean | undefined][] = [
    [
      'auto msg/s / bare POST ceiling (request())',
      auto && ceil ? `${ratio(auto, ceil).toFixed(2)}x` : 'not run',
      `>= ${GOALS.autoCeilingRatio}x`,
      auto && ceil && ratio(auto, ceil) >= GOALS.autoCeilingRatio,
    ],
    [
      'explicit msg/s / bare POST ceiling (request())',
      explicit && ceil ? `${ratio(explicit, ceil).toFixed(2)}x` : 'not run',
      `>= ${GOALS.explicitCeilingRatio}x`,
      explicit && ceil && ratio(explicit, ceil) >= GOALS.explicitCeilingRatio,
    ],
    [
      'auto: broker CPU per message',
      auto ? `${fixed(brokerUs(auto), 0)} us` : 'not run',
      `<= ${GOALS.brokerUs} us`,
      auto && brokerUs(auto) <= GOALS.brokerUs,
    ],
    [
      'auto: PostgreSQL CPU per message',
      auto ? `${fixed(postgresUs(auto), 0)} us` : 'not run',
      `<= ${GOALS.postgresUs} us`,
      auto && postgresUs(auto) <= GOALS.postgresUs,
    ],
    [
      `p99 produce-to-push at ${int(RATE)} msg/s`,
      lat ? `${fixed(lat.p99, 2)} ms (sent ${int(lat.achievedRate)}/s)` : 'not run',
      `<= ${GOALS.p99Ms} ms`,
      lat && lat.p99 <= GOALS.p99Ms && lat.achievedRate >= 0.95 * RATE,
    ],
    ['auto: msg/s end to end', auto ? int(auto.perS) : 'not run', '(no goal)', undefined],
    ['explicit: msg/s end to end', explicit ? int(explicit.perS) : 'not run', '(no goal)', undefined],
    [
      'auto: broker CPU per message / client CPU per bare request() POST',
      auto && ceil ? `${(brokerUs(auto) / ceil.clientUsPerReq!).toFixed(2)}x` : 'not run',
      '(no goal)',
      undefined,
    ],
    [
      'auto msg/s / bare dispatch() ceiling',
      auto && ceilDispatch ? `${ratio(auto, ceilDispatch).toFixed(2)}x` : 'not run',
      '(no goal)',
      undefined,
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

async function clockSkewMs(a: IpcWorker, b: IpcWorker): Promise<number> {
  // Each process's wall clock (timeOrigin + now) minus Date.now(), which they share: their difference is the skew.
  const [x, y] = await Promise.all([a.call<number>('clock', {}, 5000), b.call<number>('clock', {}, 5000)])
  return x - y
}

async function main(): Promise<void> {
  const settings = await serverSettings(SERVER_URL)
  // First: it also tells the CPU accounting which server is ours (countPostgresOf).
  const db = (run.db = await createBenchDatabase(SERVER_URL))
  const idle = cpuSnapshot(undefined)
  await sleep(1000)
  const background = cpuSince(idle, undefined)
  const started = Date.now()
  const broker = (run.broker = await startBroker(db.url, { timeoutMs: 90_000, inspect: CPU_PROF || HEAP_PROF }))
  const receiver = await startIpcWorker('bench/e2e-receiver.ts', { brokerUrl: broker.url }, 30_000)
  const load = await startIpcWorker('bench/e2e-load.ts', {}, 30_000)
  const receiverUrl = `http://127.0.0.1:${receiver.ready.port as number}`

  const brokerEnv = Object.entries(process.env)
    .filter(([k]) => k.startsWith('HOOKQ_'))
    .map(([k, v]) => `${k}=${v}`)
  console.log(
    `hookq end-to-end bench: database ${db.name}, ${PARTITIONS} partitions, maxInFlight ${MAX_IN_FLIGHT}, ` +
      `${int(MESSAGES)} messages per throughput run (batches of ${BATCH}, ${PRODUCERS} producers)`,
  )
  console.log(
    `broker pid ${broker.pid} at ${broker.url}; receiver pid ${receiver.pid} at ${receiverUrl}; load pid ${load.pid}; ` +
      `${brokerEnv.length ? brokerEnv.join(' ') : 'no HOOKQ_* settings (broker defaults)'}${CPU_PROF || HEAP_PROF ? '; profiling through the inspector' : ''}`,
  )
  console.log(
    `PostgreSQL ${settings.server_version}: fsync=${settings.fsync} synchronous_commit=${settings.synchronous_commit} ` +
      `wal_sync_method=${settings.wal_sync_method} commit_delay=${settings.commit_delay}`,
  )
  console.log(
    `host: ${cpus().length} cores, ${fixed(background.hostPct * background.cores, 0)}% of one core busy before the run ` +
      `(postgres ${fixed(background.postgresPct, 0)}%); clock skew load vs receiver ${fixed(await clockSkewMs(load, receiver), 3)} ms\n`,
  )

  let ceil: Row | undefined
  let auto: (Row & { waits?: string | undefined }) | undefined
  let explicit: (Row & { waits?: string | undefined }) | undefined
  let filtered: Row | undefined
  const batched: Row[] = []
  let produced: Row | undefined
  const lats: (Row & { achievedRate: number })[] = []
  const say = (r: Row) =>
    console.log(
      `${r.label}: ${int(r.perS)}/s over ${fixed(r.seconds, 2)} s, p50/p99 ${fixed(r.p50, 2)}/${fixed(r.p99, 2)} ms, ` +
        `broker CPU ${fixed(r.cpu.brokerPct, 0)}%, duplicates ${r.duplicates}\n  ${r.notes}`,
    )
  let ceilDispatch: Row | undefined
  // A fresh broker compiles its hot code while the first load runs (about 2 s of the optimising
  // compiler's CPU here, ~20 us per message of a 100,000-message scenario): once per process, not per
  // message, so it is run off before the measured scenarios and reported on its own.
  if (WARMUP_MESSAGES > 0 && [...SCENARIOS].some((s) => s !== 'ceiling')) {
    const w = await throughput('auto', receiver, load, receiverUrl, { warmup: true, messages: WARMUP_MESSAGES })
    console.log(
      `warm-up (not counted below): ${int(w.messages)} messages in auto mode, broker CPU ${fixed(w.cpu.brokerS, 2)} s ` +
        `(${fixed(brokerUs(w), 0)} us/msg with the compiler's start-up work in it)\n`,
    )
  }
  if (SCENARIOS.has('ceiling')) {
    ceil = await ceiling('request', receiver, load, receiverUrl)
    say(ceil)
    if (CEILING_DISPATCH) {
      ceilDispatch = await ceiling('dispatch', receiver, load, receiverUrl)
      say(ceilDispatch)
    }
  }
  if (SCENARIOS.has('produce')) {
    produced = await produceOnly(receiver, load)
    say(produced)
  }
  if (SCENARIOS.has('auto')) {
    auto = await throughput('auto', receiver, load, receiverUrl)
    say(auto)
    if (auto.waits) console.log(`  ${auto.waits}`)
  }
  for (const b of ['batch10', 'batch100'] as const)
    if (SCENARIOS.has(b)) {
      const r = await throughput(b, receiver, load, receiverUrl)
      batched.push(r)
      say(r)
    }
  const drains: Row[] = []
  for (const [s, b] of [
    ['drain', undefined],
    ['drain-batch10', 10],
    ['drain-batch100', 100],
  ] as const) {
    if (SCENARIOS.has(s)) {
      const r = await drain(b, receiver, load, receiverUrl)
      drains.push(r)
      say(r)
    }
  }
  if (SCENARIOS.has('filtered')) {
    filtered = await throughput('filtered', receiver, load, receiverUrl)
    say(filtered)
  }
  if (SCENARIOS.has('explicit')) {
    explicit = await throughput('explicit', receiver, load, receiverUrl)
    say(explicit)
    if (explicit.waits) console.log(`  ${explicit.waits}`)
  }
  if (SCENARIOS.has('latency'))
    for (const rate of RATES) {
      const l = await latency(rate, receiver, load, receiverUrl)
      lats.push(l)
      say(l)
    }

  const rows = [ceil, ceilDispatch, produced, auto, ...batched, ...drains, filtered, explicit, ...lats].filter(
    (r): r is Row => r !== undefined,
  )
  console.log(`\n${table(rows)}\n`)
  console.log(
    `msg/s: ceiling = receiver POSTs/s; produce = messages/s produced; auto/explicit = messages completed /\n` +
      `  (last completion - first produce call); latency = produce calls/s sent. p50/p99: ceiling = POST round trip; produce =\n` +
      `  produce call; auto/explicit = produce call sent -> push received, under full load; latency = produce call sent -> push\n` +
      `  received (warm-up excluded). CPU in % of one core over the scenario (${cpus().length} cores = ${cpus().length * 100}%); ` +
      `broker us/msg = broker CPU per\n  message; msg/s per broker core = what that cost allows on one whole core (the broker's JS is one thread); ` +
      `pg = all\n  postgres processes; other = rest of the host (other tenants).\n`,
  )
  if (produced && auto && explicit) {
    const us = (r: Row) => (1e6 * r.cpu.brokerS) / Math.max(1, r.messages)
    console.log(
      `broker CPU per message: produce ${fixed(us(produced), 0)} us; push + completion ${fixed(us(auto) - us(produced), 0)} us (auto), ` +
        `${fixed(us(explicit) - us(produced), 0)} us (explicit, acks included)\n`,
    )
  }
  const single = drains.find((d) => d.label.endsWith('single pushes'))
  for (const d of drains)
    if (single && d !== single) console.log(`${d.label}: ${(d.perS / single.perS).toFixed(2)}x the msg/s of the single-push drain`)
  for (const b of batched) {
    if (auto)
      console.log(
        `${b.label.split(':')[0]}: ${(b.perS / auto.perS).toFixed(2)}x the single-push msg/s of this run (goal for batch100: >= 3x)`,
      )
  }
  if (produced && filtered) {
    const us = (r: Row) => (1e6 * r.cpu.brokerS) / Math.max(1, r.messages)
    console.log(
      `broker CPU per message with a filter pushing 1 in ${KEEP_EVERY}: ${fixed(us(filtered), 0)} us per produced message, ` +
        `${fixed(us(filtered) - us(produced), 0)} us beyond produce${auto ? ` (auto, every message pushed: ${fixed(us(auto) - us(produced), 0)} us)` : ''}\n`,
    )
  }
  console.log(goals(ceil, ceilDispatch, auto, explicit, lats[0]))

  for (const p of profiles) {
    if (HEAP_PROF) {
      const a = summarizeAllocations(p.file, Math.max(1, p.messages))
      console.log(`\nbroker allocations, ${p.scenario}: ${p.file.slice(ROOT.length)}\n${formatAllocations(a, 15)}`)
      continue
    }
    const s = summarizeProfile(p.file)
    const src = s.byFunction.filter((r) => / src\//.test(r.name))
    const incl = inclusiveTimes(p.file, (f) => f.startsWith('src/')).slice(0, 12)
    const n = p.scenario === 'auto' ? 20 : 10
    console.log(`\nbroker CPU profile, ${p.scenario}: ${p.file.slice(ROOT.length)}\n${formatSummary(s, n)}`)
    console.log(
      `self time in src/ (${fixed(
        src.reduce((a, r) => a + r.pct, 0),
        1,
      )}% of busy in total):\n` +
        src
          .slice(0, n)
          .map((r) => `  ${r.pct.toFixed(1).padStart(5)}%  ${r.ms.toFixed(0).padStart(7)} ms  ${r.name}`)
          .join('\n'),
    )
    console.log(
      `total (inclusive) time of src/ functions:\n` +
        incl.map((r) => `  ${r.pct.toFixed(1).padStart(5)}%  ${r.ms.toFixed(0).padStart(7)} ms  ${r.name}`).join('\n'),
    )
  }

  await Promise.all([receiver.stop(), load.stop()])
  await stopBroker(broker)
  if (broker.child.exitCode !== 0)
    console.error(`the broker exited with ${broker.child.exitCode ?? broker.child.signalCode}:\n${broker.output()}`)
  console.log(`\nwhole run ${((Date.now() - started) / 1000).toFixed(0)} s`)
}

await runBench(main)

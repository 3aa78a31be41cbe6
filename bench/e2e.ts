/**
 * The end-to-end scenarios of `npm run bench` (bench/bench.ts runs this file for them): a fresh
 * database, the broker as a child process on it (started as `npm start` starts it), a webhook
 * receiver (bench/e2e-receiver.ts) and a load process (bench/e2e-load.ts), each its own process.
 *
 *   ceiling   bare undici POSTs of push-shaped bodies from the load process to the receiver, 64
 *             loops for 5 s: what loopback HTTP takes on this machine now, the baseline the push
 *             rates below are divided by
 *   produce   BENCH_MESSAGES produced (BENCH_BATCH messages a call, 100; from BENCH_PRODUCERS loops
 *             on a connection each, 4) to a topic no group reads: what produce alone costs, to split
 *             the end-to-end cost into produce and push
 *   auto      the same load to a topic whose group (ackMode auto) pushes to the receiver: msg/s from
 *             the first produce call to the last completion (committed offsets), produce included
 *   explicit  the same with ackMode explicit: the receiver acks over HTTP as a consumer library does
 *             (500 ids or 5 ms a call, 4 calls at most at once)
 *   drain     BENCH_MESSAGES produced to a paused group, then unpaused: the push path alone
 *   batch     the drain with batch push of up to 100 messages a POST (ratio to `drain`)
 *   latency   single-message produce calls paced at each of BENCH_RATES for 10 s (after 2 s not
 *             counted), auto mode: p50/p99 from the send time in the message to the push's arrival
 *
 * BENCH_AUTH (none, headers, jwt, oauth; default none) gives every consumer the bench makes that
 * push authentication (contract "Push authentication"): a static header, a broker-signed JWT, or an
 * OAuth 2.0 client-credentials token from an endpoint this process serves on 127.0.0.1 (one token an
 * hour: fetched once a consumer, as the broker caches it). Its CPU per message, as a ratio to a run
 * with none, is the cost of push authentication (docs/performance.md, "Push authentication").
 *
 * Before them, BENCH_WARMUP_MESSAGES (20,000; 0 for none) go through the broker unmeasured: a fresh
 * broker spends ~2 s in V8's optimising compiler under its first load, a cost per process, not per
 * message. Every load loop is bounded in count and time; a scenario that does not finish within
 * BENCH_MAX_SECONDS reports what completed. Exits non-zero only when the run itself fails.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { cpus } from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import type { ReceiverStats } from './e2e-receiver.ts'
import { brokerApi, committedOffsets, startBroker, stopBroker } from './lib/broker.ts'
import { createBenchDatabase, serverSettings } from './lib/db.ts'
import { envCount, envInt, envList } from './lib/env.ts'
import { startIpcWorker, type IpcWorker } from './lib/ipc.ts'
import { cpuSince, cpuSnapshot, othersPct, perMessage, processCpuSeconds, type CpuWindow } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { ratio } from './lib/stats.ts'

const E2E_SCENARIOS = ['ceiling', 'produce', 'auto', 'explicit', 'drain', 'batch', 'latency'] as const
const SCENARIOS = new Set(envList('BENCH_SCENARIOS', 'ceiling,produce,auto,explicit,latency'))
for (const s of SCENARIOS) if (!(E2E_SCENARIOS as readonly string[]).includes(s)) throw new Error(`BENCH_SCENARIOS: unknown scenario ${s}`)
const MESSAGES = envInt('BENCH_MESSAGES', 100_000)
const WARMUP_MESSAGES = envCount('BENCH_WARMUP_MESSAGES', 20_000)
const RATES = envList('BENCH_RATES', '5000,500').map((r) => {
  const n = Number(r)
  if (!Number.isFinite(n) || n <= 0) throw new Error(`BENCH_RATES: "${r}" is not a positive number`)
  return n
})
const PARTITIONS = envInt('BENCH_PARTITIONS', 8)
const MAX_IN_FLIGHT = envInt('BENCH_MAX_IN_FLIGHT', 200)
const MAX_SECONDS = envInt('BENCH_MAX_SECONDS', 30)
const SERVER_URL = process.env.BENCH_DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
const BATCH = Math.min(1000, envInt('BENCH_BATCH', 100))
const PRODUCERS = envInt('BENCH_PRODUCERS', 4)
const ACK = { ackBatch: 500, ackFlushMs: 5, ackConcurrency: 4 }
const AUTH_TYPES = ['none', 'headers', 'jwt', 'oauth'] as const
const AUTH = (process.env.BENCH_AUTH || 'none') as (typeof AUTH_TYPES)[number]
if (!AUTH_TYPES.includes(AUTH)) throw new Error(`BENCH_AUTH must be one of ${AUTH_TYPES.join(', ')}, got ${JSON.stringify(AUTH)}`)

const wallNow = () => performance.timeOrigin + performance.now()
const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '-')
const fixed = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : '-')
const codes = (m: Record<string, number>) =>
  Object.entries(m)
    .map(([c, n]) => `${c}:${n}`)
    .join(' ')

cleanUpOnInterrupt('the load, the receiver and the broker')

interface Row {
  label: string
  messages: number
  seconds: number
  perS: number
  p50: number
  p99: number
  cpu: CpuWindow
  /** The load process's CPU per request, us (the ceiling's client cost). */
  loadUs: number
  duplicates: number
  notes: string
}

/** What bench/e2e-load.ts's `bulk` answers. */
interface BulkResult {
  produced: number
  retries: number
  non201: Record<string, number>
  firstSendAt: number
  lastAnswerAt: number
  timedOut: boolean
  latencyMs: { p50: number; p99: number }
}

/** The workers a scenario uses, and the CPU window over it (the load's CPU apart). */
class Bench {
  constructor(
    readonly receiver: IpcWorker,
    readonly load: IpcWorker,
    readonly receiverUrl: string,
    /** The consumers' push authentication (BENCH_AUTH), as POST .../consumers takes it; undefined for none. */
    readonly auth: object | undefined,
  ) {}
  api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    return brokerApi<T>(run.broker!.url, method, path, body)
  }
  measure(): () => { cpu: CpuWindow; loadS: number } {
    const base = cpuSnapshot(run.broker!.pid)
    const load0 = processCpuSeconds(this.load.pid) ?? NaN
    return () => ({ cpu: cpuSince(base, run.broker!.pid), loadS: (processCpuSeconds(this.load.pid) ?? NaN) - load0 })
  }
  group(name: string, ackMode: 'auto' | 'explicit', extra: object = {}) {
    return { topic: name, ackMode, maxInFlight: MAX_IN_FLIGHT, ackTimeoutMs: 30_000, pushTimeoutMs: 10_000, ...extra }
  }
  async createGroup(name: string, ackMode: 'auto' | 'explicit', extra: object = {}): Promise<void> {
    await this.api('PUT', `/v1/topics/${name}`, { partitions: PARTITIONS })
    await this.api('PUT', `/v1/groups/${name}`, this.group(name, ackMode, extra))
    await this.api('POST', `/v1/groups/${name}/consumers`, {
      url: `${this.receiverUrl}/p/${name}`,
      ...(this.auth ? { auth: this.auth } : {}),
    })
  }
  produce(topic: string, total: number): Promise<BulkResult> {
    const args = {
      url: `${run.broker!.url}/v1/topics/${topic}/messages`,
      total,
      batch: BATCH,
      concurrency: PRODUCERS,
      maxSeconds: MAX_SECONDS,
    }
    return this.load.call<BulkResult>('bulk', args, MAX_SECONDS * 1000 + 60_000)
  }
  /** Waits until `expected` messages are completed (committed offsets); when it saw that (NaN at the deadline), and how many. */
  async completed(group: string, expected: number, deadlineMs: number): Promise<{ at: number; completed: number }> {
    let completed = 0
    for (let i = 0; i < 100_000 && wallNow() < deadlineMs; i++) {
      completed = await committedOffsets(run.broker!.url, group)
      if (completed >= expected) return { at: wallNow(), completed }
      await sleep(10)
    }
    return { at: NaN, completed }
  }
  /** After a scenario: its group paused, so that a backlog left by a timed-out run does not disturb the next; the broker alive. */
  async finish(name: string, ackMode: 'auto' | 'explicit'): Promise<ReceiverStats> {
    await this.api('PUT', `/v1/groups/${name}`, this.group(name, ackMode, { paused: true }))
    const b = run.broker!.child
    if (b.exitCode !== null || b.signalCode !== null) throw new Error(`the broker died during ${name}:\n${run.broker!.output()}`)
    return this.receiver.call<ReceiverStats>('stats', {}, 5000)
  }
}

async function ceiling(b: Bench): Promise<Row> {
  await b.receiver.call('scenario', { name: 'ceiling', mode: 'count', expect: 0 }, 5000)
  const end = b.measure()
  const r = await b.load.call<{
    ok: number
    sent: number
    errors: number
    non2xx: Record<string, number>
    seconds: number
    latencyMs: { p50: number; p99: number }
  }>('posts', { url: `${b.receiverUrl}/p/ceiling`, concurrency: 64, warmupS: 1, measureS: 5, maxRequests: 5_000_000 }, 35_000)
  const { cpu, loadS } = end()
  const st = await b.receiver.call<ReceiverStats>('stats', {}, 5000)
  const failed = r.errors + Object.values(r.non2xx).reduce((a, n) => a + n, 0)
  return {
    label: 'ceiling: bare undici request() POSTs, 64 loops',
    messages: r.ok,
    seconds: r.seconds,
    perS: r.ok / r.seconds,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    cpu,
    loadUs: (1e6 * loadS) / Math.max(1, r.sent),
    duplicates: st.duplicates,
    notes: `POST round trip p50/p99; receiver got ${int(st.unique)} of ${int(r.sent)} sent${failed ? `; failed ${failed} ${codes(r.non2xx)}` : ''}`,
  }
}

async function produceOnly(b: Bench): Promise<Row> {
  const name = 'e2e-produce'
  await b.api('PUT', `/v1/topics/${name}`, { partitions: PARTITIONS })
  const end = b.measure()
  const r = await b.produce(name, MESSAGES)
  const { cpu } = end()
  const seconds = (r.lastAnswerAt - r.firstSendAt) / 1000
  const notes = [
    r.timedOut ? `TIMED OUT: ${int(r.produced)} of ${int(MESSAGES)} produced` : '',
    r.retries ? `retries ${r.retries} ${codes(r.non201)}` : '',
  ]
  return {
    label: `produce only: ${BATCH} a call, ${PRODUCERS} loops, no group`,
    messages: r.produced,
    seconds,
    perS: r.produced / seconds,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    cpu,
    loadUs: NaN,
    duplicates: 0,
    notes: ['produce call p50/p99', ...notes].filter(Boolean).join('; '),
  }
}

/** auto or explicit: the group pushes while the messages are produced. */
async function throughput(b: Bench, ackMode: 'auto' | 'explicit', messages: number, name = `e2e-${ackMode}`): Promise<Row> {
  await b.createGroup(name, ackMode)
  await b.receiver.call('scenario', { name, mode: ackMode === 'auto' ? 'count' : 'ack', expect: messages, group: name, ...ACK }, 5000)
  await sleep(500) // the group's start-up reads
  const end = b.measure()
  const deadline = wallNow() + MAX_SECONDS * 1000
  const done = b.receiver.next('done', MAX_SECONDS * 1000 + 5000).catch(() => undefined)
  const r = await b.produce(name, messages)
  if (r.produced < messages) await b.receiver.call('expect', { n: r.produced }, 5000)
  await Promise.race([done, sleep(Math.max(0, deadline - wallNow()))])
  const c = await b.completed(name, r.produced, Math.max(deadline, wallNow() + 2000))
  const { cpu } = end()
  const st = await b.finish(name, ackMode)
  const seconds = ((Number.isFinite(c.at) ? c.at : wallNow()) - r.firstSendAt) / 1000
  const notes = [
    Number.isFinite(c.at) ? '' : `TIMED OUT after ${MAX_SECONDS} s: ${int(c.completed)} of ${int(r.produced)} completed`,
    `produce ${int(r.produced / ((r.lastAnswerAt - r.firstSendAt) / 1000))}/s, call p99 ${fixed(r.latencyMs.p99, 0)} ms`,
    st.acks ? `acks: ${st.acks.calls} calls, ${codes(st.acks.statuses)}${st.acks.errors ? `, errors ${st.acks.errors}` : ''}` : '',
  ]
  return {
    label: `${ackMode}: ${PARTITIONS} partitions, maxInFlight ${MAX_IN_FLIGHT}`,
    messages: c.completed,
    seconds,
    perS: c.completed / seconds,
    p50: st.latencyMs.p50,
    p99: st.latencyMs.p99,
    cpu,
    loadUs: NaN,
    duplicates: st.duplicates,
    notes: ['produce-to-push p50/p99', ...notes].filter(Boolean).join('; '),
  }
}

/** A backlog pushed: produced while the group is paused, timed from the unpause; `batch` messages a POST at most. */
async function drain(b: Bench, batch: number | undefined): Promise<Row> {
  const name = batch ? `e2e-batch${batch}` : 'e2e-drain'
  const extra = batch ? { batch: { maxMessages: batch } } : {}
  await b.createGroup(name, 'auto', { ...extra, paused: true })
  await b.receiver.call('scenario', { name, mode: 'count', expect: MESSAGES, group: name }, 5000)
  const r = await b.produce(name, MESSAGES)
  if (r.produced < MESSAGES) await b.receiver.call('expect', { n: r.produced }, 5000)
  await sleep(500)
  const end = b.measure()
  const startedAt = wallNow()
  const done = b.receiver.next('done', MAX_SECONDS * 1000 + 5000).catch(() => undefined)
  await b.api('PUT', `/v1/groups/${name}`, b.group(name, 'auto', { ...extra, paused: false }))
  await Promise.race([done, sleep(MAX_SECONDS * 1000)])
  const c = await b.completed(name, r.produced, wallNow() + 5000)
  const { cpu } = end()
  const st = await b.finish(name, 'auto')
  const seconds = ((Number.isFinite(c.at) ? c.at : wallNow()) - startedAt) / 1000
  return {
    label: `${batch ? 'batch' : 'drain'}: a backlog, ${batch ? `batches of ${batch}` : 'single pushes'}`,
    messages: c.completed,
    seconds,
    perS: c.completed / seconds,
    p50: NaN,
    p99: NaN,
    cpu,
    loadUs: NaN,
    duplicates: st.duplicates,
    notes: Number.isFinite(c.at) ? `${int(st.pushes)} POSTs` : `TIMED OUT: ${int(c.completed)} of ${int(r.produced)} completed`,
  }
}

async function latency(b: Bench, rate: number): Promise<Row> {
  const name = `e2e-latency-${rate}`
  await b.createGroup(name, 'auto')
  await b.receiver.call('scenario', { name, mode: 'count', expect: 0 }, 5000)
  await sleep(500)
  const end = b.measure()
  const done = b.receiver.next('done', 42_000).catch(() => undefined)
  const url = `${run.broker!.url}/v1/topics/${name}/messages`
  const r = await b.load.call<{
    produced: number
    sent: number
    scheduled: number
    errors: number
    non201: Record<string, number>
    firstSendAt: number
    lastSendAt: number
    achievedRate: number
    produceLatencyMs: { p50: number; p99: number }
  }>('paced', { url, rate, warmupS: 2, measureS: 10, maxOutstanding: 2000, connections: 64 }, 72_000)
  await b.receiver.call('expect', { n: r.produced }, 5000)
  await Promise.race([done, sleep(10_000)])
  const c = await b.completed(name, r.produced, wallNow() + 10_000)
  const { cpu } = end()
  const st = await b.finish(name, 'auto')
  const failed = r.errors + Object.values(r.non201).reduce((a, n) => a + n, 0)
  const notes = [
    `sent ${int(r.achievedRate)}/s${r.sent < r.scheduled ? ` (${int(r.scheduled - r.sent)} of ${int(r.scheduled)} not sent in time)` : ''}`,
    `produce call p50/p99 ${fixed(r.produceLatencyMs.p50, 2)}/${fixed(r.produceLatencyMs.p99, 2)} ms`,
    failed ? `produce failed ${failed} ${codes(r.non201)}` : '',
    Number.isFinite(c.at) ? '' : `NOT COMPLETED: ${int(c.completed)} of ${int(r.produced)}`,
  ]
  const seconds = (r.lastSendAt - r.firstSendAt) / 1000
  return {
    label: `latency: 1 msg/call at ${int(rate)}/s, auto`,
    messages: r.produced,
    seconds,
    perS: r.produced / seconds,
    p50: st.latencyMs.p50,
    p99: st.latencyMs.p99,
    cpu,
    loadUs: NaN,
    duplicates: st.duplicates,
    notes: ['produce-to-push p50/p99 (warm-up excluded)', ...notes].filter(Boolean).join('; '),
  }
}

function table(rows: Row[]): string {
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
    const m = r.label.startsWith('ceiling') ? { brokerUs: NaN, postgresUs: NaN } : perMessage(r.cpu, r.messages)
    return [
      r.label,
      int(r.perS),
      fixed(r.seconds, 2),
      fixed(r.p50, 2),
      fixed(r.p99, 2),
      fixed(m.brokerUs, 0),
      fixed(m.postgresUs, 0),
      fixed(r.cpu.brokerPct, 0),
      fixed(r.cpu.postgresPct, 0),
      fixed(othersPct(r.cpu), 0),
      int(r.duplicates),
    ]
  })
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n')
}

/**
 * The consumers' auth for BENCH_AUTH; for oauth, a token endpoint on 127.0.0.1 (client credentials,
 * a token valid an hour) that counts the tokens it gave.
 */
async function consumerAuth(): Promise<{ auth: object | undefined; tokens: () => number; close: () => void }> {
  const none = { tokens: () => 0, close: () => {} }
  if (AUTH === 'none') return { auth: undefined, ...none }
  if (AUTH === 'headers') return { auth: { type: 'headers', headers: { 'x-api-key': 'bench-api-key-value' } }, ...none }
  if (AUTH === 'jwt') return { auth: { type: 'jwt' }, ...none }
  let tokens = 0
  const server = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      tokens++
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ access_token: `bench-token-${tokens}`, token_type: 'Bearer', expires_in: 3600 }))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const tokenUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/token`
  return {
    auth: { type: 'oauth2', tokenUrl, clientId: 'bench', clientSecret: 'bench-client-secret' },
    tokens: () => tokens,
    close: () => server.close(),
  }
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
  const auth = await consumerAuth()
  const b = new Bench(receiver, load, `http://127.0.0.1:${receiver.ready.port as number}`, auth.auth)
  const hookq = Object.entries(process.env).filter(([k]) => k.startsWith('HOOKQ_'))
  console.log(
    `hookq end to end: ${int(MESSAGES)} messages a scenario, ${PARTITIONS} partitions, maxInFlight ${MAX_IN_FLIGHT}; ` +
      `${hookq.length ? hookq.map(([k, v]) => `${k}=${v}`).join(' ') : 'broker defaults'}; consumer auth ${AUTH} (BENCH_AUTH); ${cpus().length} cores; ` +
      `PostgreSQL ${settings.server_version} fsync=${settings.fsync} synchronous_commit=${settings.synchronous_commit}\n`,
  )
  const say = (r: Row) =>
    console.log(
      `${r.label}: ${int(r.perS)}/s over ${fixed(r.seconds, 2)} s, p50/p99 ${fixed(r.p50, 2)}/${fixed(r.p99, 2)} ms\n  ${r.notes}`,
    )
  if (WARMUP_MESSAGES > 0 && [...SCENARIOS].some((s) => s !== 'ceiling')) {
    const w = await throughput(b, 'auto', WARMUP_MESSAGES, 'e2e-warmup')
    console.log(`warm-up, not counted: ${int(w.messages)} messages, ${fixed(perMessage(w.cpu, w.messages).brokerUs, 0)} broker us/msg\n`)
  }
  const rows = new Map<string, Row>()
  const runs: [string, () => Promise<Row>][] = [
    ['ceiling', () => ceiling(b)],
    ['produce', () => produceOnly(b)],
    ['auto', () => throughput(b, 'auto', MESSAGES)],
    ['explicit', () => throughput(b, 'explicit', MESSAGES)],
    ['drain', () => drain(b, undefined)],
    ['batch', () => drain(b, 100)],
    ...RATES.map((rate): [string, () => Promise<Row>] => [`latency-${rate}`, () => latency(b, rate)]),
  ]
  for (const [key, scenario] of runs) {
    if (!SCENARIOS.has(key.startsWith('latency') ? 'latency' : key)) continue
    const r = await scenario()
    rows.set(key, r)
    say(r)
  }
  console.log(`\n${table([...rows.values()])}\n`)
  console.log(
    'msg/s: ceiling POSTs/s; produce msg/s produced; auto/explicit completed / (last completion - first produce call); drain and\n' +
      'batch completed / (last completion - unpause); latency calls/s sent. us/msg: CPU per message from /proc (pg: the bench\n' +
      "server's processes); CPU% of one core; other: the rest of the host (the load, the receiver, other tenants).\n",
  )
  for (const line of ratios(rows)) console.log(line)
  if (AUTH === 'oauth') console.log(`oauth: ${auth.tokens()} token(s) fetched from the bench's token endpoint`)
  auth.close()
  await Promise.all([receiver.stop(), load.stop()])
  await stopBroker(broker)
  console.log(`\nwhole run ${((Date.now() - started) / 1000).toFixed(0)} s`)
}

await runBench(main)

/**
 * The end-to-end scenarios, shared by bench/e2e.ts (one broker) and bench/ab.ts (two, in turns): a
 * Target is one broker with its webhook receiver (bench/e2e-receiver.ts), fed by a load process
 * (bench/e2e-load.ts); each scenario makes a topic and group of its own on it and answers a Row,
 * its CPU window included.
 *
 *   ceiling   bare undici POSTs of push-shaped bodies from the load process to the receiver, 64
 *             loops for 5 s: what loopback HTTP takes on this machine now, the baseline of push rates
 *   produce   messages produced (`batch` a call from `producers` loops) to a topic no group reads
 *   auto      the same load to a topic whose group (ackMode auto) pushes to the receiver: msg/s from
 *             the first produce call to the last completion (committed offsets), produce included
 *   explicit  the same with ackMode explicit: the receiver acks over HTTP as a consumer library does
 *             (500 ids or 5 ms a call, 4 calls at most at once)
 *   drain     messages produced to a paused group, then unpaused: the push path alone
 *   batch     the drain with batch push of up to 100 messages a POST
 *   latency   single-message produce calls paced at a rate, auto mode: p50/p99 from the send time in
 *             the message to the push's arrival (the warm-up's messages not counted)
 */
import { setTimeout as sleep } from 'node:timers/promises'
import type { Answers } from '../e2e-load.ts'
import type { ReceiverStats } from '../e2e-receiver.ts'
import { type BrokerProcess, brokerApi, committedOffsets, serve } from './broker.ts'
import type { IpcWorker } from './ipc.ts'
import { type CpuWindow, cpuSince, cpuSnapshot, perMessage } from './proc.ts'
import { codes, fixed, int } from './stats.ts'

const wallNow = () => performance.timeOrigin + performance.now()

export interface E2eConfig {
  messages: number
  partitions: number
  maxInFlight: number
  maxSeconds: number
  /** Messages a produce call, and the produce loops. */
  batch: number
  producers: number
}

export interface Row {
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
  /** The produce call's own p50/p99, ms (produce, auto, explicit, latency). */
  call?: { p50: number; p99: number }
  notes: string
}

/** One broker, its receiver and the load that feeds it. */
export class Target {
  readonly receiverUrl: string
  constructor(
    readonly broker: BrokerProcess,
    readonly receiver: IpcWorker,
    readonly load: IpcWorker,
    readonly cfg: E2eConfig,
    /** The consumers' push authentication, as POST .../consumers takes it; undefined for none. */
    readonly auth?: object,
  ) {
    this.receiverUrl = `http://127.0.0.1:${receiver.ready.port as number}`
  }
  api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    return brokerApi<T>(this.broker.url, method, path, body)
  }
  /** Starts a CPU window (the broker, PostgreSQL, the host); the function returned ends it. */
  measure(): () => { cpu: CpuWindow } {
    const base = cpuSnapshot(this.broker.pid)
    return () => ({ cpu: cpuSince(base, this.broker.pid) })
  }
  group(name: string, ackMode: 'auto' | 'explicit', extra: object = {}) {
    return { topic: name, ackMode, maxInFlight: this.cfg.maxInFlight, ackTimeoutMs: 30_000, pushTimeoutMs: 10_000, ...extra }
  }
  async createGroup(name: string, ackMode: 'auto' | 'explicit', extra: object = {}): Promise<void> {
    await this.api('PUT', `/v1/topics/${name}`, { partitions: this.cfg.partitions })
    await this.api('PUT', `/v1/groups/${name}`, this.group(name, ackMode, extra))
    await this.api('POST', `/v1/groups/${name}/consumers`, {
      url: `${this.receiverUrl}/p/${name}`,
      ...(this.auth ? { auth: this.auth } : {}),
    })
  }
  /** `total` messages to `topic`, as fast as the broker takes them or at `rate` a second. */
  produce(topic: string, total: number, rate?: number): Promise<Answers['bulk']> {
    const { batch, producers, maxSeconds } = this.cfg
    const args = { url: this.broker.url, topic, total, batch, concurrency: producers, maxSeconds, rate }
    return this.load.call<Answers['bulk']>('bulk', args, maxSeconds * 1000 + 60_000)
  }
  /** Waits until `expected` messages are completed (committed offsets); when it saw that (NaN at the deadline), and how many. */
  async completed(group: string, expected: number, deadlineMs: number): Promise<{ at: number; completed: number }> {
    let completed = 0
    for (let i = 0; i < 100_000 && wallNow() < deadlineMs; i++) {
      completed = await committedOffsets(this.broker.url, group)
      if (completed >= expected) return { at: wallNow(), completed }
      await sleep(10)
    }
    return { at: NaN, completed }
  }
  /** After a scenario: its group paused, so that a backlog left by a timed-out run does not disturb the next; the broker alive. */
  async finish(name: string, ackMode: 'auto' | 'explicit'): Promise<ReceiverStats> {
    await this.api('PUT', `/v1/groups/${name}`, this.group(name, ackMode, { paused: true }))
    const b = this.broker.child
    if (b.exitCode !== null || b.signalCode !== null) throw new Error(`the broker died during ${name}:\n${this.broker.output()}`)
    return this.receiver.call<ReceiverStats>('stats', {}, 5000)
  }
}

/** Its CPU window is the load process's (in the broker's place): the client's cost of a bare POST. */
export async function ceiling(t: Pick<Target, 'receiver' | 'load' | 'receiverUrl'>, name = 'ceiling'): Promise<Row> {
  await t.receiver.call('scenario', { name, mode: 'count', expect: 0 }, 5000)
  const base = cpuSnapshot(t.load.pid)
  const args = { url: `${t.receiverUrl}/p/${name}`, concurrency: 64, warmupS: 1, measureS: 5, maxRequests: 5_000_000 }
  const r = await t.load.call<Answers['posts']>('posts', args, 35_000)
  const cpu = cpuSince(base, t.load.pid)
  const st = await t.receiver.call<ReceiverStats>('stats', {}, 5000)
  const failed = r.errors + Object.values(r.non2xx).reduce((a, n) => a + n, 0)
  return {
    label: 'ceiling: bare undici request() POSTs, 64 loops',
    messages: r.ok,
    seconds: r.seconds,
    perS: r.ok / r.seconds,
    ...r.latencyMs,
    cpu,
    // Over all it sent, its warm-up second included.
    loadUs: perMessage(cpu, r.sent).brokerUs,
    duplicates: st.duplicates,
    notes: `POST round trip p50/p99; receiver got ${int(st.unique)} of ${int(r.sent)} sent${failed ? `; failed ${failed} ${codes(r.non2xx)}` : ''}`,
  }
}

export async function produceOnly(t: Target, name = 'e2e-produce'): Promise<Row> {
  const { messages, batch, producers } = t.cfg
  await t.api('PUT', `/v1/topics/${name}`, { partitions: t.cfg.partitions })
  const end = t.measure()
  const r = await t.produce(name, messages)
  const { cpu } = end()
  const seconds = (r.lastAnswerAt - r.firstSendAt) / 1000
  const notes = [
    'produce call p50/p99',
    r.timedOut ? `TIMED OUT: ${int(r.produced)} of ${int(messages)} produced` : '',
    r.retries ? `retries ${r.retries} ${codes(r.non201)}` : '',
  ]
  return {
    label: `produce only: ${batch} a call, ${producers} loops, no group`,
    messages: r.produced,
    seconds,
    perS: r.produced / seconds,
    ...r.latencyMs,
    cpu,
    loadUs: NaN,
    duplicates: 0,
    call: r.latencyMs,
    notes: notes.filter(Boolean).join('; '),
  }
}

/** auto or explicit: the group pushes while the messages are produced. */
export async function throughput(
  t: Target,
  ackMode: 'auto' | 'explicit',
  messages = t.cfg.messages,
  name = `e2e-${ackMode}`,
): Promise<Row> {
  const { maxSeconds } = t.cfg
  await t.createGroup(name, ackMode)
  await t.receiver.call('scenario', { name, mode: ackMode === 'auto' ? 'count' : 'ack', expect: messages, group: name }, 5000)
  await sleep(500) // the group's start-up reads
  const end = t.measure()
  const deadline = wallNow() + maxSeconds * 1000
  const done = t.receiver.next('done', maxSeconds * 1000 + 5000).catch(() => undefined)
  const r = await t.produce(name, messages)
  if (r.produced < messages) await t.receiver.call('expect', { n: r.produced }, 5000)
  await Promise.race([done, sleep(Math.max(0, deadline - wallNow()))])
  const c = await t.completed(name, r.produced, Math.max(deadline, wallNow() + 2000))
  const { cpu } = end()
  const st = await t.finish(name, ackMode)
  const seconds = ((Number.isFinite(c.at) ? c.at : wallNow()) - r.firstSendAt) / 1000
  const notes = [
    'produce-to-push p50/p99',
    Number.isFinite(c.at) ? '' : `TIMED OUT after ${maxSeconds} s: ${int(c.completed)} of ${int(r.produced)} completed`,
    `produce ${int(r.produced / ((r.lastAnswerAt - r.firstSendAt) / 1000))}/s, call p99 ${fixed(r.latencyMs.p99, 0)} ms`,
    st.acks ? `acks: ${st.acks.calls} calls, ${codes(st.acks.statuses)}${st.acks.errors ? `, errors ${st.acks.errors}` : ''}` : '',
  ]
  return {
    label: `${ackMode}: ${t.cfg.partitions} partitions, maxInFlight ${t.cfg.maxInFlight}`,
    messages: c.completed,
    seconds,
    perS: c.completed / seconds,
    ...st.latencyMs,
    cpu,
    loadUs: NaN,
    duplicates: st.duplicates,
    call: r.latencyMs,
    notes: notes.filter(Boolean).join('; '),
  }
}

/** A backlog pushed: produced while the group is paused, timed from the unpause; `batch` messages a POST at most. */
export async function drain(t: Target, batch: number | undefined, name = batch ? `e2e-batch${batch}` : 'e2e-drain'): Promise<Row> {
  const { messages, maxSeconds } = t.cfg
  const extra = batch ? { batch: { maxMessages: batch } } : {}
  await t.createGroup(name, 'auto', { ...extra, paused: true })
  await t.receiver.call('scenario', { name, mode: 'count', expect: messages, group: name }, 5000)
  const r = await t.produce(name, messages)
  if (r.produced < messages) await t.receiver.call('expect', { n: r.produced }, 5000)
  await sleep(500)
  const end = t.measure()
  const startedAt = wallNow()
  const done = t.receiver.next('done', maxSeconds * 1000 + 5000).catch(() => undefined)
  await t.api('PUT', `/v1/groups/${name}`, t.group(name, 'auto', { ...extra, paused: false }))
  await Promise.race([done, sleep(maxSeconds * 1000)])
  const c = await t.completed(name, r.produced, wallNow() + 5000)
  const { cpu } = end()
  const st = await t.finish(name, 'auto')
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

/** Single-message produce calls at `rate` a second for `warmupS` (not counted) and `measureS`, auto mode. */
export async function latency(t: Target, rate: number, warmupS = 2, measureS = 10, name = `e2e-latency-${rate}`): Promise<Row> {
  await t.createGroup(name, 'auto')
  await t.receiver.call('scenario', { name, mode: 'count', expect: 0 }, 5000)
  await sleep(500)
  const end = t.measure()
  const done = t.receiver.next('done', (warmupS + measureS) * 1000 + 30_000).catch(() => undefined)
  const url = `${t.broker.url}/v1/topics/${name}/messages`
  const r = await t.load.call<Answers['paced']>(
    'paced',
    { url, rate, warmupS, measureS, maxOutstanding: 2000, connections: 64 },
    (warmupS + measureS) * 1000 + 60_000,
  )
  await t.receiver.call('expect', { n: r.produced }, 5000)
  await Promise.race([done, sleep(10_000)])
  const c = await t.completed(name, r.produced, wallNow() + 10_000)
  const { cpu } = end()
  const st = await t.finish(name, 'auto')
  const failed = r.errors + Object.values(r.non201).reduce((a, n) => a + n, 0)
  const notes = [
    'produce-to-push p50/p99 (warm-up excluded)',
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
    ...st.latencyMs,
    cpu,
    loadUs: NaN,
    duplicates: st.duplicates,
    call: r.produceLatencyMs,
    notes: notes.filter(Boolean).join('; '),
  }
}

export const AUTH_TYPES = ['none', 'headers', 'jwt', 'oauth'] as const
export type AuthType = (typeof AUTH_TYPES)[number]

/** Checks a BENCH_AUTH-like setting. */
export function authType(name: string, fallback: AuthType = 'none'): AuthType {
  const v = (process.env[name] || fallback) as AuthType
  if (!AUTH_TYPES.includes(v)) throw new Error(`${name} must be one of ${AUTH_TYPES.join(', ')}, got ${JSON.stringify(v)}`)
  return v
}

/**
 * The consumers' push authentication (contract "Push authentication") of `type`: a static header,
 * a broker-signed JWT, or OAuth 2.0 client credentials from a token endpoint this process serves on
 * 127.0.0.1 (a token valid an hour, so fetched once a consumer, as the broker caches it).
 */
export async function consumerAuth(type: AuthType): Promise<{ auth: object | undefined; tokens: () => number; close: () => void }> {
  const none = { tokens: () => 0, close: () => {} }
  if (type === 'none') return { auth: undefined, ...none }
  if (type === 'headers') return { auth: { type: 'headers', headers: { 'x-api-key': 'bench-api-key-value' } }, ...none }
  if (type === 'jwt') return { auth: { type: 'jwt' }, ...none }
  let tokens = 0
  const endpoint = await serve(() => {
    tokens++
    return JSON.stringify({ access_token: `bench-token-${tokens}`, token_type: 'Bearer', expires_in: 3600 })
  })
  return {
    auth: { type: 'oauth2', tokenUrl: `${endpoint.url}/token`, clientId: 'bench', clientSecret: 'bench-client-secret' },
    tokens: () => tokens,
    close: endpoint.close,
  }
}

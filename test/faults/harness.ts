/**
 * A small Jepsen-style harness for hookq: the real broker as a child process, or several sharing one
 * database (each owns and pushes a share of the partitions), optionally behind a loopback TCP proxy
 * to PostgreSQL; a history of every produce call, webhook receivers that record every push and ack
 * over HTTP, samplers of the group's committed offsets and of who owns each partition, fault
 * injection, and a checker for the at-least-once invariants.
 *
 * Histories: every produce call ends as
 *   ok      — answered 2xx: the coordinates are known and the message must never be lost;
 *   failed  — answered non-2xx (400/404/413/429/503...): expected not stored (a stored one is reported);
 *   unknown — timed out, the connection failed, or the broker answered outcome_unknown (its
 *             database connection broke during the commit): it may or may not have been stored.
 *
 * Invariants checked by `check()` (see README.md in this folder):
 *   lost        every ok message is in the log at its coordinates, was pushed, and is completed
 *               (committedOffset past it);
 *   altered     every push's value equals what was produced at its coordinates, and every stored
 *               message was produced (no phantom), at most once (no double storage of one call);
 *   failed      no message of a call answered non-2xx (503) is stored;
 *   monotonic   sampled committed offsets never move backwards, per partition;
 *   attempts    no attempt number above maxDeliveries (pushes and the deliveries table), and no
 *               message pushed twice with one attempt number (the broker reserves first pushes and
 *               records retries before they go out, so a crash cannot make it repeat one);
 *   exclusive   no message both acked (ack answered `acked`) and dead-lettered;
 *   no-repush   no message pushed again well after an ack for it was answered `acked`;
 *   resources   broker RSS below a generous bound; at rest, fewer than 256 file descriptors and
 *               no more database connections than the pool holds (plus one), per live process;
 *   one owner   (several processes) at every sample no partition is held by two processes, and at
 *               rest every partition is owned by exactly one live process (OwnershipSampler).
 * Duplicates (pushes of a message beyond the first) are allowed, counted and reported.
 */
import { readFile, readdir, readlink } from 'node:fs/promises'
import { isDeepStrictEqual } from 'node:util'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import type { Test } from 'tap'
import { testDatabase } from '../helpers/db.ts'
import { spawnBroker, type BrokerProcess } from '../helpers/process.ts'
import { startPrivatePostgres, type PrivatePostgres } from '../helpers/private-postgres.ts'
import { startReceiver, type BehaviourSpec, type Receiver } from '../helpers/receiver.ts'
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

export type Tap = Test

export const PROFILE = process.env.HOOKQ_FAULTS_PROFILE === 'long' ? 'long' : 'short'
export const LONG = PROFILE === 'long'

/** Totals over every scenario of a run, for the summary. */
export const totals = {
  messages: 0,
  produceOk: 0,
  produceFailed: 0,
  produceUnknown: 0,
  faults: 0,
  lost: 0,
  duplicates: 0,
  pushes: 0,
  deadLettered: 0,
  violations: 0,
  failedButStored: 0,
}

export async function http(base: string, method: string, path: string, body?: unknown, timeoutMs = 10_000) {
  const res = await fetch(base + path, {
    method,
    headers: body !== undefined ? { 'content-type': 'application/json' } : {},
    body: body !== undefined ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(timeoutMs),
  })
  const text = await res.text()
  let json: any = null
  try {
    json = JSON.parse(text)
  } catch {
    /* not JSON */
  }
  return { status: res.status, json, headers: res.headers }
}

const coord = (p: number, o: number) => `${p}:${o}`

// ---------------------------------------------------------------- the system under test

export interface ClusterOptions {
  /** Put a cuttable TCP proxy between the broker and PostgreSQL. */
  proxy?: boolean
  /** Run on a PostgreSQL server of the test's own, which the test may crash (`stopPostgres`). */
  privatePostgres?: boolean
  env?: Record<string, string>
  /**
   * Broker processes sharing the database (default 1). With more than one, each gets
   * HOOKQ_CLUSTER_POLL_MS=200: each owns (pushes) its share of the partitions, and the others
   * forward acks and the group status to the owners.
   */
  processes?: number
}

/** How often the processes poll and rebalance, with several of them (HOOKQ_CLUSTER_POLL_MS). */
export const CLUSTER_POLL_MS = 200

/**
 * One or several broker processes on one fresh database; restartable; a process's base URL
 * changes on every start. `broker`/`base` are the oldest live process (with one process: the
 * process, as it always was); `nextBase()` spreads calls over the live ones.
 */
export class Cluster {
  /** Every broker process started, in order of start, the dead ones included. */
  readonly procs: BrokerProcess[] = []
  private exited = new Set<BrokerProcess>()
  /** When each process killed on purpose was signalled (the samplers discount its answers). */
  readonly killedAt = new Map<BrokerProcess, number>()
  private rr = 0
  dbUrl = ''
  dbName = ''
  proxy: TcpProxy | undefined
  postgres: PrivatePostgres | undefined
  private env: Record<string, string> = {}
  private checker: pg.Client | undefined
  starts = 0
  faults: string[] = []

  private constructor(private opts: ClusterOptions) {}

  static async start(t: Tap, opts: ClusterOptions = {}): Promise<Cluster> {
    const n = opts.processes ?? 1
    if (!Number.isInteger(n) || n < 1 || n > 8) throw new Error(`ClusterOptions.processes must be an integer from 1 to 8, got ${n}`)
    const c = new Cluster(opts)
    const db = opts.privatePostgres ? await c.privateDatabase(t) : await testDatabase(t)
    c.dbUrl = db.url
    c.dbName = new URL(db.url).pathname.slice(1)
    let brokerDb = db.url
    if (opts.proxy) {
      const u = new URL(db.url)
      c.proxy = await startTcpProxy(u.hostname, Number(u.port || 5432))
      t.teardown(() => c.proxy!.close())
      u.hostname = '127.0.0.1'
      u.port = String(c.proxy.port)
      brokerDb = u.href
    }
    c.env = {
      DATABASE_URL: brokerDb,
      HOOKQ_DB_POOL_SIZE: '5',
      HOOKQ_SHUTDOWN_GRACE_MS: '5000',
      ...(n > 1 ? { HOOKQ_CLUSTER_POLL_MS: String(CLUSTER_POLL_MS) } : {}),
      ...opts.env,
    }
    t.teardown(async () => {
      const live = c.live
      for (const b of live) b.child.kill('SIGKILL')
      await Promise.race([Promise.all(live.map((b) => b.exited)), sleep(5000)])
      await c.checker?.end().catch(() => {})
    })
    // The template database is migrated already: the processes start side by side and race for the lock.
    await Promise.all(Array.from({ length: n }, () => c.spawn()))
    return c
  }

  /** How many broker processes the cluster runs (ClusterOptions.processes). */
  get processCount(): number {
    return this.opts.processes ?? 1
  }

  /** The processes alive now (not seen exited), in order of start. */
  get live(): BrokerProcess[] {
    return this.procs.filter((b) => !this.exited.has(b))
  }

  /** The oldest live process; with none alive, the last one started (its URL refuses connections). */
  get broker(): BrokerProcess {
    const b = this.live[0] ?? this.procs[this.procs.length - 1]
    if (!b) throw new Error('no broker process was started')
    return b
  }

  /** The base URL of `broker`. */
  get base(): string {
    return this.broker.url
  }

  /** Base URLs of the live processes. */
  liveBases(): string[] {
    return this.live.map((b) => b.url)
  }

  /**
   * The next live process's base URL, round robin (with one process: its URL, dead or alive). A
   * process killed a moment ago may still be picked until its exit is seen: that call fails, as a
   * call to a dying broker does.
   */
  nextBase(): string {
    const live = this.live
    if (live.length === 0) return this.base
    return live[this.rr++ % live.length]!.url
  }

  /** An empty database on a server of our own: the broker migrates it at its first start. */
  private async privateDatabase(t: Tap): Promise<{ url: string }> {
    this.postgres = await startPrivatePostgres(t)
    const admin = new pg.Client({ connectionString: this.postgres.url })
    await admin.connect()
    try {
      await admin.query('CREATE DATABASE hookq_faults')
    } finally {
      await admin.end()
    }
    const u = new URL(this.postgres.url)
    u.pathname = '/hookq_faults'
    return { url: u.href }
  }

  /** `pg_ctl stop -m immediate`: PostgreSQL crashes under the broker (no checkpoint; WAL replay at start). */
  async stopPostgres(): Promise<void> {
    if (!this.postgres) throw new Error('cluster started without a private PostgreSQL')
    this.faults.push('PostgreSQL stop -m immediate')
    await this.checker?.end().catch(() => {})
    this.checker = undefined
    await this.postgres.stopImmediate()
  }

  async startPostgres(): Promise<void> {
    await this.postgres!.start()
  }

  private async spawn(): Promise<BrokerProcess> {
    const b = await spawnBroker(this.env)
    this.procs.push(b)
    void b.exited.then(() => {
      this.exited.add(b)
    })
    this.starts++
    return b
  }

  /** Whether `broker` is alive (with one process: the process). */
  get alive(): boolean {
    return !this.exited.has(this.broker)
  }

  /** A variable of the broker's environment. */
  envValue(name: string): string | undefined {
    return this.env[name]
  }

  /** SIGKILL and start again on the same database. */
  async killAndRestart(): Promise<void> {
    const b = this.broker
    this.faults.push('SIGKILL')
    this.killedAt.set(b, Date.now())
    b.child.kill('SIGKILL')
    await b.exited
    await this.spawn()
  }

  /**
   * The warnings and errors the processes logged (pino JSON lines, level 40 and up), counted by
   * message, most frequent first: what went wrong inside the broker, for the report.
   */
  logSummary(max = 12): string[] {
    const counts = new Map<string, number>()
    for (const b of this.procs) {
      for (const line of b.output().split('\n')) {
        let rec: { level?: number; msg?: string; detail?: string; err?: { message?: string } | string }
        try {
          rec = JSON.parse(line)
        } catch {
          continue
        }
        if (!rec || typeof rec.level !== 'number' || rec.level < 40) continue
        const err = typeof rec.err === 'string' ? rec.err : rec.err?.message
        const why = [rec.detail, err]
          .filter((x): x is string => typeof x === 'string' && x.length > 0)
          .map((x) => x.slice(0, 120))
          .join(' / ')
        const key = `${rec.level >= 50 ? 'ERROR' : 'WARN'} ${rec.msg ?? ''}${why ? ` (${why})` : ''}`
        counts.set(key, (counts.get(key) ?? 0) + 1)
      }
    }
    return [...counts]
      .sort((a, b) => b[1] - a[1])
      .slice(0, max)
      .map(([k, n]) => `${n}× ${k}`)
  }

  /** How many group partitions a process says it owns (`hookq_partitions_owned`); 0 when it does not answer. */
  async ownedBy(b: BrokerProcess, timeoutMs = 2000): Promise<number> {
    try {
      const res = await fetch(`${b.url}/metrics`, { signal: AbortSignal.timeout(timeoutMs) })
      return Number(/^hookq_partitions_owned (\d+)$/m.exec(await res.text())?.[1] ?? 0)
    } catch {
      return 0
    }
  }

  /** The live processes that own partitions now (asked side by side). */
  async owners(timeoutMs = 2000): Promise<BrokerProcess[]> {
    const live = this.live
    const owned = await Promise.all(live.map((b) => this.ownedBy(b, timeoutMs)))
    return live.filter((_, i) => owned[i]! > 0)
  }

  /**
   * Who holds each group partition, from pg_locks: problems (a partition held twice, by no one, or
   * by a process that is not a live member), none when every partition has exactly one live owner.
   */
  async ownershipProblems(): Promise<string[]> {
    const db = await this.sql()
    const { rows } = await db.query<{ group_name: string; partition: number; holders: number; live: number }>(
      `
      WITH locks AS (SELECT pid, classid::bigint AS hi, objid::bigint AS lo, mode FROM pg_locks
                     WHERE locktype = 'advisory' AND granted AND objsubid = 1
                       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
           members AS (SELECT m.backend_pid FROM broker_members m JOIN locks l ON l.pid = m.backend_pid AND l.mode = 'ShareLock')
      SELECT g.name AS group_name, p.partition,
             (SELECT count(*)::int FROM locks l WHERE l.hi = $1 + g.id AND l.lo = p.partition AND l.mode = 'ExclusiveLock') AS holders,
             (SELECT count(*)::int FROM locks l JOIN members m ON m.backend_pid = l.pid WHERE l.hi = $1 + g.id AND l.lo = p.partition AND l.mode = 'ExclusiveLock') AS live
      FROM consumer_groups g JOIN topics t ON t.name = g.topic, generate_series(0, t.partitions - 1) AS p(partition)`,
      [0x48000000],
    )
    return rows
      .filter((r) => r.holders !== 1 || r.live !== 1)
      .map((r) => `${r.group_name}/${r.partition}: ${r.holders} holder(s), ${r.live} of them live members`)
  }

  /**
   * SIGKILL a process that owns partitions, wait until every partition has a live owner again
   * (bounded by `takeoverTimeoutMs`; the caller asserts the time), then start a replacement on the
   * same database (it takes its share from the others).
   */
  async killOwnerAndReplace(
    takeoverTimeoutMs = 20_000,
  ): Promise<{ killed: BrokerProcess; takeoverMs: number; replacement: BrokerProcess }> {
    if (this.processCount < 2) throw new Error('killOwnerAndReplace needs a cluster of several processes')
    const killed = await waitUntil(async () => (await this.owners())[0], 10_000, 'a broker process that owns partitions', 100)
    this.faults.push('SIGKILL of an owner')
    const t0 = Date.now()
    this.killedAt.set(killed, t0)
    killed.child.kill('SIGKILL')
    await waitUntil(() => this.exited.has(killed), 10_000, `pid ${killed.child.pid} to exit after SIGKILL`)
    await waitUntil(
      async () => (await this.ownershipProblems()).length === 0,
      takeoverTimeoutMs,
      'every partition owned by a live process again',
      25,
    )
    const takeoverMs = Date.now() - t0
    const replacement = await this.spawn()
    return { killed, takeoverMs, replacement }
  }

  /** SIGTERM: resolves with the exit code and how long it took; then starts again. */
  async termAndRestart(): Promise<{ code: number | string; ms: number }> {
    const b = this.broker
    this.faults.push('SIGTERM')
    const t0 = Date.now()
    b.child.kill('SIGTERM')
    const code = await Promise.race([b.exited, sleep(30_000).then(() => 'did not exit in 30 s')])
    const ms = Date.now() - t0
    if (!this.exited.has(b)) {
      b.child.kill('SIGKILL')
      await b.exited
    }
    await this.spawn()
    return { code, ms }
  }

  /** SIGSTOP for `ms`, then SIGCONT. */
  async pause(ms: number): Promise<void> {
    this.faults.push(`SIGSTOP ${ms} ms`)
    this.broker.child.kill('SIGSTOP')
    try {
      await sleep(ms)
    } finally {
      this.broker.child.kill('SIGCONT')
    }
  }

  /** Cut the proxy between broker and PostgreSQL for `ms`; `during` runs while it is cut. */
  async cutDatabase<T>(ms: number, during: () => Promise<T>): Promise<T> {
    if (!this.proxy) throw new Error('cluster started without a proxy')
    this.faults.push(`database cut ${ms} ms`)
    await this.proxy.cut()
    const t0 = Date.now()
    try {
      const result = await during()
      const left = ms - (Date.now() - t0)
      if (left > 0) await sleep(left)
      return result
    } finally {
      await this.proxy.heal()
    }
  }

  /** A direct connection to the test database (not through the proxy), for checks and faults. */
  async sql(): Promise<pg.Client> {
    if (!this.checker) {
      this.checker = new pg.Client({ connectionString: this.dbUrl })
      this.checker.on('error', () => {})
      await this.checker.connect()
    }
    return this.checker
  }

  /** pg_terminate_backend on every backend of OUR database except the checker's own. */
  async terminateBrokerConnections(): Promise<number> {
    this.faults.push('pg_terminate_backend')
    const c = await this.sql()
    const r = await c.query(`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, [
      this.dbName,
    ])
    return r.rowCount ?? 0
  }

  /** A broker process's open file descriptors (default `broker`), and how many of them are sockets. */
  async openFds(b: BrokerProcess = this.broker): Promise<{ fds: number; sockets: number }> {
    const dir = `/proc/${b.child.pid}/fd`
    const names = await readdir(dir)
    const links = await Promise.all(names.map((n) => readlink(`${dir}/${n}`).catch(() => '')))
    return { fds: names.length, sockets: links.filter((l) => l.startsWith('socket:')).length }
  }

  /** Connections to the test database other than the checker's own. */
  async databaseConnections(): Promise<number> {
    const c = await this.sql()
    const r = await c.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, [this.dbName])
    return r.rows[0].n as number
  }

  /** A broker process's resident memory (default `broker`), bytes. */
  async rssBytes(b: BrokerProcess = this.broker): Promise<number> {
    const status = await readFile(`/proc/${b.child.pid}/status`, 'utf8')
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(status)
    return m ? Number(m[1]) * 1024 : NaN
  }
}

// ---------------------------------------------------------------- history

export interface ProduceOp {
  id: number
  status: 'ok' | 'failed' | 'unknown'
  httpStatus?: number
  error?: string
  values: unknown[]
  results?: { partition: number; offset: number; duplicate?: boolean }[]
  start: number
  end: number
}

export class History {
  ops: ProduceOp[] = []
  /** value id → the op that sent it. */
  private byId = new Map<string, ProduceOp>()
  /** "p:o" → value, for ok produces. */
  okAt = new Map<string, unknown>()
  private seq = 0

  constructor(readonly run: string) {}

  /** A fresh, unique value (its `id` names it in checks). */
  value(extra: Record<string, unknown> = {}): { id: string; n: number } & Record<string, unknown> {
    const n = this.seq++
    return { id: `${this.run}-${n}`, n, pad: 'x'.repeat(n % 37), ...(n % 11 === 0 ? { nul: 'a\u0000b' } : {}), ...extra }
  }

  /** One produce call, recorded whatever happens. */
  async produce(
    base: string,
    topic: string,
    messages: { value: any; key?: string; idempotencyKey?: string }[],
    timeoutMs = 8000,
  ): Promise<ProduceOp> {
    const op: ProduceOp = { id: this.ops.length, status: 'unknown', values: messages.map((m) => m.value), start: Date.now(), end: 0 }
    this.ops.push(op)
    for (const v of op.values) if (v && typeof v === 'object' && 'id' in v) this.byId.set(String((v as any).id), op)
    try {
      const r = await http(base, 'POST', `/v1/topics/${topic}/messages`, { messages }, timeoutMs)
      op.httpStatus = r.status
      if (r.status >= 200 && r.status < 300) {
        op.status = 'ok'
        op.results = r.json.results
        op.results!.forEach((res, i) => {
          if (!res.duplicate) this.okAt.set(coord(res.partition, res.offset), op.values[i])
        })
      } else {
        // outcome_unknown: the connection broke while committing; the broker cannot tell either way.
        op.status = r.json?.code === 'outcome_unknown' ? 'unknown' : 'failed'
        op.error = `${r.status} ${r.json?.code ?? ''}`
      }
    } catch (err) {
      op.status = 'unknown'
      op.error = `${(err as Error).name}: ${(err as Error).message}`
    }
    op.end = Date.now()
    return op
  }

  opOf(valueId: string): ProduceOp | undefined {
    return this.byId.get(valueId)
  }
  count(status: ProduceOp['status']): number {
    return this.ops.filter((o) => o.status === status).length
  }
  messagesOk(): number {
    return this.okAt.size
  }
}

/**
 * Produces batches in `concurrency` loops, every call recorded, from now until `stop()` has been
 * called and at least `minMessages` were answered 2xx (so faults always land mid-load), or
 * `maxMs` passed. Calls that fail back off 200 ms.
 */
export function loadGenerator(
  cluster: Cluster,
  history: History,
  topic: string,
  opts: { batch: number; concurrency: number; minMessages: number; pauseMs: number; maxMs: number },
) {
  let stopping = false
  let ok = 0
  // The load lasts until stop() (the scenario's faults are done) and minMessages are in, or maxMs
  // passed by then: a scenario whose restarts run slow on a busy machine still has load to the
  // end, where it once ran dry and a fault left waiting for acks of messages never produced.
  // Never past three times maxMs, nor 50,000 calls a loop.
  const deadline = Date.now() + opts.maxMs
  const hardDeadline = Date.now() + 3 * opts.maxMs
  const loops = Array.from({ length: opts.concurrency }, async () => {
    for (let i = 0; i < 50_000 && Date.now() < hardDeadline && !(stopping && (ok >= opts.minMessages || Date.now() >= deadline)); i++) {
      const messages = Array.from({ length: opts.batch }, (_, j) => {
        const value = history.value()
        return j % 3 === 0 ? { value, key: `k${value.n % 13}` } : { value }
      })
      const op = await history.produce(cluster.nextBase(), topic, messages)
      if (op.status === 'ok') ok += messages.length
      await sleep(op.status === 'ok' ? opts.pauseMs : 200)
    }
  })
  const done = Promise.all(loops)
  return {
    get ok() {
      return ok
    },
    /** Ends the load (once at least minMessages are ok, or maxMs has passed) and resolves when it has. */
    stop: async () => {
      stopping = true
      await done
    },
  }
}

// ---------------------------------------------------------------- consumers

export interface Push {
  partition: number
  offset: number
  value: unknown
  attempt: number
  deliveryId: string
  /** When it arrived here. */
  at: number
  /** Its envelope's ackDeadline (ms): the broker's clock at the attempt's start plus the group's ackTimeoutMs. */
  deadline: number
}

export interface ConsumerOptions {
  group: string
  /** Chance the ack is delayed by up to `slowAckMs` (default 0.1, 300 ms). */
  slowAckChance?: number
  slowAckMs?: number
  /** How to answer a push; default 200 then ack. Return `ack: false` to not ack. */
  answer?: (p: Push) => { spec: BehaviourSpec; ack: boolean }
}

/** A webhook receiver that records every push and acks accepted ones over HTTP (explicit mode). */
export class Consumer {
  pushes: Push[] = []
  /** "p:o" → time an ack for it was answered `acked`. */
  acked = new Map<string, number>()
  ackCalls = { acked: 0, already_completed: 0, unknown: 0, other: 0, errors: 0 }
  /** Ack calls tried again on another process (several processes only). */
  ackRetries = 0
  /** Pushes whose ack was answered `unknown` (the first 1000), though the broker issued their ids. */
  unknownAcks: Push[] = []
  receiver!: Receiver
  private pendingAcks = new Set<Promise<void>>()

  private constructor(
    private cluster: Cluster,
    private opts: ConsumerOptions,
  ) {}

  static async start(t: Tap, cluster: Cluster, opts: ConsumerOptions): Promise<Consumer> {
    const c = new Consumer(cluster, opts)
    c.receiver = await startReceiver(t, (req) => c.onPush(req.json as any))
    return c
  }

  private onPush(env: {
    deliveryId: string
    partition: number
    offset: number
    value: unknown
    attempt: number
    ackDeadline: string
  }): BehaviourSpec {
    const p: Push = {
      partition: env.partition,
      offset: env.offset,
      value: env.value,
      attempt: env.attempt,
      deliveryId: env.deliveryId,
      at: Date.now(),
      deadline: Date.parse(env.ackDeadline),
    }
    this.pushes.push(p)
    const { spec, ack } = this.opts.answer ? this.opts.answer(p) : { spec: { status: 200 }, ack: true }
    if (ack) {
      const slow = Math.random() < (this.opts.slowAckChance ?? 0.1)
      const delay = (spec.delayMs ?? 0) + (slow ? Math.floor(Math.random() * (this.opts.slowAckMs ?? 300)) : Math.floor(Math.random() * 10))
      const done = sleep(delay)
        .then(() => this.ack(p))
        .finally(() => this.pendingAcks.delete(done))
      this.pendingAcks.add(done)
    }
    return spec
  }

  /**
   * One ack call, through the processes round robin (a process forwards it to the partition's
   * owner). With several processes, a call that fails (the process died: connection refused or
   * reset) or is answered 503 (no owner yet, or the owner died under the forwarded call) is tried again on the
   * next live process, a few times; with one process there is one try, as there always was.
   */
  private async ack(p: Push): Promise<void> {
    const tries = this.cluster.processCount > 1 ? 8 : 1
    for (let i = 1; i <= tries; i++) {
      try {
        const r = await http(this.cluster.nextBase(), 'POST', `/v1/groups/${this.opts.group}/acks`, { deliveryIds: [p.deliveryId] }, 10_000)
        if (r.status === 503 && i < tries) {
          this.ackRetries++
          await sleep(150)
          continue
        }
        const status = r.status === 200 ? r.json.results[0].status : 'other'
        if (status === 'acked') this.acked.set(coord(p.partition, p.offset), Date.now())
        if (status === 'unknown' && this.unknownAcks.length < 1000) this.unknownAcks.push(p)
        if (status in this.ackCalls) (this.ackCalls as any)[status]++
        else this.ackCalls.other++
        return
      } catch {
        // Outcome unknown (it may have been applied: a retry then says already_completed); the
        // deadline brings the message back otherwise.
        if (i < tries) {
          this.ackRetries++
          await sleep(50)
          continue
        }
        this.ackCalls.errors++
      }
    }
  }

  async drainAcks(): Promise<void> {
    await Promise.race([Promise.all([...this.pendingAcks]), sleep(15_000)])
  }
}

// ---------------------------------------------------------------- committed-offset sampler

export class OffsetSampler {
  samples: { at: number; committed: number[] }[] = []
  private stopped = false
  private loop: Promise<void>

  constructor(cluster: Cluster, group: string, everyMs = 200) {
    this.loop = (async () => {
      // Sequential: one sample at a time, so their order is the order of the states they saw.
      for (let i = 0; i < 20_000 && !this.stopped; i++) {
        try {
          // Round robin over the live processes (each forwards to the partitions' owners); the status
          // reads committed offsets from the database, so samples from different processes compare.
          const r = await http(cluster.nextBase(), 'GET', `/v1/groups/${group}`, undefined, 3000)
          if (r.status === 200) {
            const committed: number[] = []
            for (const p of r.json.partitions) committed[p.partition] = p.committedOffset
            this.samples.push({ at: Date.now(), committed })
          }
        } catch {
          /* the broker is down or stopped: no sample */
        }
        await sleep(everyMs)
      }
    })()
  }

  async stop(): Promise<void> {
    this.stopped = true
    await this.loop
  }
}

// ---------------------------------------------------------------- ownership sampler

/**
 * Reads who holds each group partition (pg_locks ⨝ the live members) every `everyMs` for the whole
 * run. A partition held by two processes at once would be two pushers; one held by nobody is a move
 * under way (counted, and bounded by the takeover assertions).
 */
export class OwnershipSampler {
  samples = 0
  /** Samples with some partition owned by no live process (a move under way). */
  unowned = 0
  /** Samples with a partition held twice, described. */
  overlaps: string[] = []
  private stopped = false
  private loop: Promise<void>

  constructor(cluster: Cluster, everyMs = 200) {
    this.loop = (async () => {
      for (let i = 0; i < 20_000 && !this.stopped; i++) {
        const problems = await cluster.ownershipProblems().catch(() => undefined)
        if (problems) {
          this.samples++
          const twice = problems.filter((p) => /^[^:]+: ([2-9]|\d\d+) holder/.test(p))
          if (problems.length > twice.length) this.unowned++
          if (twice.length > 0 && this.overlaps.length < 50) this.overlaps.push(`${new Date().toISOString()}: ${twice.join('; ')}`)
        }
        await sleep(everyMs)
      }
    })()
  }

  async stop(): Promise<void> {
    this.stopped = true
    await this.loop
  }
}

// ---------------------------------------------------------------- quiesce and check

/** Waits until every partition of the group has lag 0 and nothing in flight (bounded). */
export async function quiesce(cluster: Cluster, group: string, timeoutMs = 60_000): Promise<any> {
  return waitUntil(
    async () => {
      const r = await http(cluster.base, 'GET', `/v1/groups/${group}`, undefined, 5000)
      if (r.status !== 200) return undefined
      return r.json.partitions.every((p: any) => p.lag === 0 && p.committedOffset === p.endOffset) ? r.json : undefined
    },
    timeoutMs,
    `group ${group} to reach lag 0`,
    250,
  )
}

/** Every message of a topic, read back over HTTP (bounded pages). */
export async function readTopic(cluster: Cluster, topic: string): Promise<any[]> {
  const t = await http(cluster.base, 'GET', `/v1/topics/${topic}`)
  const all: any[] = []
  for (let p = 0; p < t.json.partitions; p++) {
    let from = 0
    for (let page = 0; page < 1000; page++) {
      const r = await http(cluster.base, 'GET', `/v1/topics/${topic}/partitions/${p}/messages?fromOffset=${from}&limit=1000`)
      all.push(...r.json.messages)
      if (r.json.messages.length === 0 || r.json.nextOffset === from) break
      from = r.json.nextOffset
    }
  }
  return all
}

export interface CheckInput {
  t: Tap
  cluster: Cluster
  history: History
  consumers: Consumer[]
  sampler: OffsetSampler
  topic: string
  group: string
  maxDeliveries: number
  deadLetterTopic?: string
  /** RSS bound, bytes (default 768 MiB). */
  maxRssBytes?: number
  /** Several processes: the ownership samples taken during the run (stopped before the check). */
  owners?: OwnershipSampler
}

export interface CheckResult {
  lost: number
  duplicates: number
  pushes: number
  messages: number
  deadLettered: number
  violations: string[]
}

export async function check(inp: CheckInput): Promise<CheckResult> {
  const { t, cluster, history, consumers, sampler, topic, group, maxDeliveries } = inp
  const violations: string[] = []
  const v = (what: string) => {
    if (violations.length < 200) violations.push(what)
  }
  const pushes = consumers.flatMap((c) => c.pushes)
  const acked = new Map<string, number>()
  for (const c of consumers) for (const [k, at] of c.acked) if (!acked.has(k) || acked.get(k)! > at) acked.set(k, at)

  // The log as stored: each message produced (no phantom), once (no double storage), unaltered.
  const log = await readTopic(cluster, topic)
  const logAt = new Map<string, unknown>()
  const seenIds = new Map<string, string>()
  // A call answered non-2xx (503 + Retry-After: "retry, nothing was promised") must not be stored:
  // a client retrying it (without an idempotency key) would store it twice.
  const failedButStored: string[] = []
  for (const m of log) {
    const k = coord(m.partition, m.offset)
    logAt.set(k, m.value)
    const id = m.value?.id
    const op = typeof id === 'string' ? history.opOf(id) : undefined
    if (!op) {
      v(`phantom message in the log at ${k}: ${JSON.stringify(m.value)}`)
      continue
    }
    if (!op.values.some((x) => isDeepStrictEqual(x, m.value))) v(`altered message in the log at ${k}: ${JSON.stringify(m.value)}`)
    if (seenIds.has(id)) v(`message ${id} stored twice: ${seenIds.get(id)} and ${k}`)
    seenIds.set(id, k)
    if (op.status === 'failed') failedButStored.push(`message ${id} of a produce call answered ${op.error} is stored at ${k}`)
  }

  // No lost ok-produce: stored at its coordinates, pushed, completed.
  const status = await http(cluster.base, 'GET', `/v1/groups/${group}`)
  const committed: number[] = []
  for (const p of status.json.partitions) committed[p.partition] = p.committedOffset
  const pushedAt = new Set(pushes.map((p) => coord(p.partition, p.offset)))
  const ackTimeoutMs: number = status.json.ackTimeoutMs
  let lost = 0
  for (const [k, value] of history.okAt) {
    const [p, o] = k.split(':').map(Number) as [number, number]
    const problems: string[] = []
    if (!logAt.has(k)) problems.push('not in the log')
    else if (!isDeepStrictEqual(logAt.get(k), value)) problems.push(`log holds ${JSON.stringify(logAt.get(k))}`)
    if (!pushedAt.has(k)) problems.push('never pushed')
    if (!(committed[p]! > o)) problems.push(`committedOffset ${committed[p]} not past it`)
    if (problems.length) {
      lost++
      v(`lost ok-produce at ${k} (${JSON.stringify(value)}): ${problems.join(', ')}`)
    }
  }

  // Every push carries what was stored at its coordinates.
  const attemptsSeen = new Set<string>()
  for (const p of pushes) {
    const k = coord(p.partition, p.offset)
    const expected = history.okAt.has(k) ? history.okAt.get(k) : logAt.get(k)
    if (expected === undefined && !logAt.has(k)) v(`push of ${k} (attempt ${p.attempt}) is not in the log: ${JSON.stringify(p.value)}`)
    else if (!isDeepStrictEqual(p.value, expected))
      v(`push of ${k} carries ${JSON.stringify(p.value)}, produced ${JSON.stringify(expected)}`)
    if (p.attempt > maxDeliveries) v(`push of ${k} with attempt ${p.attempt} > maxDeliveries ${maxDeliveries}`)
    if (attemptsSeen.has(`${k}#${p.attempt}`)) v(`push of ${k} with attempt ${p.attempt} a second time`)
    attemptsSeen.add(`${k}#${p.attempt}`)
    const ackAt = acked.get(k)
    // Begun after an ack answered 'acked': the attempt's start, from its envelope (the same clock),
    // not its arrival here, which a loaded machine delays by seconds (CI: pushes begun before the
    // ack arrived 3-6 s after it at a load average of 18).
    const startedAt = p.deadline - ackTimeoutMs
    if (!Number.isFinite(startedAt)) v(`push of ${k} (attempt ${p.attempt}) has no ackDeadline to date its start by`)
    if (ackAt !== undefined && startedAt > ackAt)
      v(`push of ${k} (attempt ${p.attempt}) begun ${startedAt - ackAt} ms after an ack answered 'acked'`)
  }

  // Committed offsets never move backwards.
  for (let i = 1; i < sampler.samples.length; i++) {
    const a = sampler.samples[i - 1]!,
      b = sampler.samples[i]!
    b.committed.forEach((off, p) => {
      if (a.committed[p] !== undefined && off < a.committed[p]!)
        v(`partition ${p} committedOffset went back from ${a.committed[p]} to ${off} (${b.at - a.at} ms apart)`)
    })
  }

  // Attempts, from the deliveries table (the broker's own record).
  const db = await cluster.sql()
  const rows = (
    await db.query(
      `SELECT d.partition, d."offset"::int AS "offset", max(d.attempt) AS max_attempt,
            count(*)::int AS n, bool_or(d.outcome = 'acked') AS acked, bool_or(d.outcome = 'dead') AS dead
       FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
      WHERE g.name = $1 GROUP BY d.partition, d."offset"`,
      [group],
    )
  ).rows
  for (const r of rows) {
    if (r.max_attempt > maxDeliveries)
      v(`deliveries table: ${r.partition}:${r.offset} attempt ${r.max_attempt} > maxDeliveries ${maxDeliveries}`)
    if (r.acked && r.dead) v(`deliveries table: ${r.partition}:${r.offset} both acked and dead`)
  }

  // Acks answered `unknown` although the id was pushed (the contract keeps `unknown` for ids the group
  // never issued): reported with whether the broker kept a row of the attempt, and how long before a
  // SIGKILL it was pushed. Not an invariant (yet): the message comes again and is acked then.
  const unknownAcks = consumers.flatMap((c) => c.unknownAcks)
  if (unknownAcks.length) {
    const kept = new Set(
      (await db.query(`SELECT id FROM deliveries WHERE id = ANY($1)`, [unknownAcks.map((p) => p.deliveryId)])).rows.map(
        (r) => r.id as string,
      ),
    )
    // Push time relative to the nearest SIGKILL (negative: before it; a push seen just after was sent just before).
    const kills = [...cluster.killedAt.values()]
    const rel = kills.length ? unknownAcks.map((p) => kills.map((k) => p.at - k).reduce((a, b) => (Math.abs(b) < Math.abs(a) ? b : a))) : []
    t.comment(
      `${unknownAcks.length} acks answered 'unknown' for delivery ids the broker pushed: ${unknownAcks.length - kept.size} of them have no row in deliveries; ` +
        (rel.length ? `received ${Math.min(...rel)} to ${Math.max(...rel)} ms from the nearest SIGKILL` : 'no SIGKILL in this scenario'),
    )
  }

  // Dead letters: never also acked; each is the original message.
  let deadLettered = 0
  if (inp.deadLetterTopic) {
    const dlq = await readTopic(cluster, inp.deadLetterTopic)
    const dead = new Map<string, number>()
    for (const m of dlq) {
      const k = coord(Number(m.headers['hookq-dlq-partition']), Number(m.headers['hookq-dlq-offset']))
      dead.set(k, (dead.get(k) ?? 0) + 1)
      if (m.headers['hookq-dlq-topic'] !== topic || m.headers['hookq-dlq-group'] !== group)
        v(`dead letter with wrong headers: ${JSON.stringify(m.headers)}`)
      if (!isDeepStrictEqual(m.value, logAt.get(k)))
        v(`dead letter for ${k} carries ${JSON.stringify(m.value)}, log holds ${JSON.stringify(logAt.get(k))}`)
      if (acked.has(k)) v(`message ${k} both acked and dead-lettered`)
      if (Number(m.headers['hookq-dlq-attempts']) > maxDeliveries)
        v(`dead letter for ${k} after ${m.headers['hookq-dlq-attempts']} attempts`)
    }
    deadLettered = dead.size
    const twice = [...dead].filter(([, n]) => n > 1).length
    if (twice) t.comment(`${twice} messages dead-lettered more than once (an at-least-once duplicate in the DLQ)`)
    // Completed without an ack we saw answered and without a dead letter: only an ack whose answer was lost.
    const neither = log.filter((m) => !acked.has(coord(m.partition, m.offset)) && !dead.has(coord(m.partition, m.offset))).length
    if (neither) t.comment(`${neither} messages completed with no ack answered 'acked' seen and no dead letter (ack answers lost)`)
  }

  // Bounded resources, for every live process (with one: the broker).
  const live = cluster.live.length ? cluster.live : [cluster.broker]
  const maxRss = inp.maxRssBytes ?? 768 * 1024 * 1024
  const rssAll: number[] = [],
    fdsAll: number[] = [],
    socketsAll: number[] = []
  for (const b of live) {
    const rss = await cluster.rssBytes(b)
    rssAll.push(rss)
    const who = live.length > 1 ? `broker pid ${b.child.pid}` : 'broker'
    if (!(rss < maxRss)) v(`${who} RSS ${Math.round(rss / 1048576)} MiB >= ${Math.round(maxRss / 1048576)} MiB`)
    // Quiesced: sockets are the listener, the pool's database connections and kept-alive push and
    // client connections (undici keeps at most 32 per consumer origin; a process up to 16 to each
    // partition owner it forwards to); a leak per push or per fault would pass these bounds in any run.
    const { fds, sockets } = await cluster.openFds(b)
    fdsAll.push(fds)
    socketsAll.push(sockets)
    if (!(fds < 256)) v(`${who} holds ${fds} file descriptors (${sockets} sockets) at rest`)
  }
  const rss = Math.max(...rssAll),
    fds = Math.max(...fdsAll),
    sockets = Math.max(...socketsAll)
  // Each process: its pool plus its member session. Those of killed processes must be gone.
  const dbConnections = await cluster.databaseConnections()
  const pool = Number(cluster.envValue('HOOKQ_DB_POOL_SIZE') ?? 10)
  if (!(dbConnections <= live.length * (pool + 1)))
    v(`${dbConnections} connections to the database at rest, ${live.length} process(es) of pool size ${pool}`)

  // Several processes: never a partition held twice; at rest every one owned by exactly one live process.
  let ownershipNote = ''
  if (inp.owners) {
    for (const o of inp.owners.overlaps) v(`a partition held by two processes at once: ${o}`)
    for (const p of await cluster.ownershipProblems()) v(`at rest: ${p}`)
    const sessions = (
      await db.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = 'hookq-member'`, [
        cluster.dbName,
      ])
    ).rows[0].n as number
    if (sessions > live.length)
      v(`${sessions} member sessions open for ${live.length} live processes (a killed process's session survived)`)
    const o = inp.owners
    ownershipNote =
      `; ${live.length} live processes of ${cluster.procs.length} started; ownership samples ${o.samples} (${o.unowned} with a partition moving, ` +
      `${o.overlaps.length} with one held twice)`
  }

  const distinct = new Set(pushes.map((p) => coord(p.partition, p.offset))).size
  const duplicates = pushes.length - distinct
  const maxAttemptSeen = pushes.reduce((m, p) => Math.max(m, p.attempt), 0)
  const ackCalls = consumers
    .map((c) => JSON.stringify(c.ackCalls) + (c.ackRetries ? ` (${c.ackRetries} retried on another process)` : ''))
    .join(' ')
  const errors = new Map<string, number>()
  for (const op of history.ops) if (op.error) errors.set(op.error.slice(0, 80), (errors.get(op.error.slice(0, 80)) ?? 0) + 1)
  if (errors.size) t.comment(`produce errors: ${[...errors].map(([e, n]) => `${n}× ${e}`).join('; ')}`)
  t.comment(
    `history: ${history.ops.length} produce calls (ok ${history.count('ok')}, failed ${history.count('failed')}, unknown ${history.count('unknown')}); ` +
      `${history.messagesOk()} messages ok, ${log.length} in the log; faults: ${cluster.faults.join(', ') || 'none'}`,
  )
  t.comment(
    `pushes ${pushes.length} for ${distinct} messages: ${duplicates} duplicates; max attempt ${maxAttemptSeen}; dead-lettered ${deadLettered}; ` +
      `ack answers ${ackCalls}; offset samples ${sampler.samples.length}; RSS ${Math.round(rss / 1048576)} MiB; ` +
      `${fds} fds (${sockets} sockets), ${dbConnections} database connections at rest${ownershipNote}`,
  )

  t.equal(lost, 0, 'no lost ok-produce')
  t.same(violations, [], 'no invariant violation')
  t.same(failedButStored, [], 'no message of a produce call answered non-2xx is stored (an in-doubt commit must not be a retryable 503)')
  t.ok(history.messagesOk() > 0, 'some messages were produced')

  totals.messages += history.messagesOk()
  totals.produceOk += history.count('ok')
  totals.produceFailed += history.count('failed')
  totals.produceUnknown += history.count('unknown')
  totals.faults += cluster.faults.length
  totals.lost += lost
  totals.duplicates += duplicates
  totals.pushes += pushes.length
  totals.deadLettered += deadLettered
  totals.violations += violations.length + failedButStored.length
  totals.failedButStored += failedButStored.length
  return { lost, duplicates, pushes: pushes.length, messages: history.messagesOk(), deadLettered, violations }
}

/** Topic + group + one consumer registered. */
export async function setup(
  cluster: Cluster,
  topic: string,
  group: string,
  groupConfig: Record<string, unknown>,
  consumers: Consumer[],
  partitions = 4,
  dlq?: string,
): Promise<void> {
  const must = async (p: Promise<{ status: number; json: any }>, what: string) => {
    const r = await p
    if (r.status >= 300) throw new Error(`${what}: ${r.status} ${JSON.stringify(r.json)}`)
  }
  await must(http(cluster.base, 'PUT', `/v1/topics/${topic}`, { partitions }), 'create topic')
  if (dlq) await must(http(cluster.base, 'PUT', `/v1/topics/${dlq}`, { partitions: 1 }), 'create DLQ topic')
  await must(
    http(cluster.base, 'PUT', `/v1/groups/${group}`, { topic, ...(dlq ? { deadLetterTopic: dlq } : {}), ...groupConfig }),
    'create group',
  )
  for (const c of consumers)
    await must(http(cluster.base, 'POST', `/v1/groups/${group}/consumers`, { url: c.receiver.url }), 'register consumer')
}

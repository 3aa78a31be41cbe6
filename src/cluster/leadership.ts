/**
 * Several broker processes on one database: every process serves the API, one of them pushes.
 *
 * States of a process:
 *
 *   follower ──lock taken──▶ leader (a Dispatcher of its own, one per term)
 *      ▲                        │
 *      └── session lost ────────┘ (the lock's connection ended: the term's dispatcher stops at once)
 *
 * - Leadership is a PostgreSQL session advisory lock (src/store/leadership.ts): released by the
 *   server whenever the holder's session ends, so a killed or cut-off leader is replaced after at
 *   most one poll (HOOKQ_LEADER_POLL_MS) of a follower, and two leaders never hold it at once. A
 *   leader cut off from the database stops pushing as soon as its session is seen lost; until then
 *   two processes may push the same message (at least once allows it; the completions both write
 *   only ever move committed offsets forward).
 * - A new term rebuilds everything from PostgreSQL, as a restart does.
 * - A follower tells the leader what it changed (appends, groups, topics) with NOTIFY; the leader
 *   LISTENs before its term starts, so nothing committed meanwhile is missed (and the term reads
 *   end offsets from the database anyway).
 * - Calls that need the leader's memory (acks, nacks, extend, seek, the group status) are forwarded
 *   to it over HTTP by src/http/forward.ts, to the URL it recorded.
 *
 * With the embedded database there is one process by construction: it leads at once, no lock.
 */
import type { AckStatus, Dispatcher } from '../dispatch/dispatcher.ts'
import { HookqError } from '../errors.ts'
import { APPEND_CHANNEL, CHANGE_CHANNEL, LeaderConnection, leaderUrl, MAX_PAYLOAD_BYTES, publish } from '../store/leadership.ts'
import type { DispatchMessage } from '../store/consumption.ts'
import type pg from 'pg'

export type Role = 'follower' | 'leader'

/** How long a looked-up leader URL is reused: a takeover is noticed within this (plus the poll). */
const LEADER_URL_TTL_MS = 1000
/** How often the leader re-reads end offsets and groups (what a lost NOTIFY did not tell): by time, not
 * by polls, so a short HOOKQ_LEADER_POLL_MS does not make it reload every group several times a second. */
const RECONCILE_EVERY_MS = 5000

/** What a follower tells the leader changed. */
type Change = { group: string } | { topicCreated: string } | { topicDeleted: number }

export interface LeadershipDeps {
  /** The database, for the lock's own session; null: the embedded database (lead at once, alone). */
  connectionString: string | null
  pool: pg.Pool
  /** How often a follower tries to take the lock, and the leader proves it still holds it, ms. */
  pollMs: number
  /** A new, not yet started dispatcher for a term. */
  newDispatcher(): Dispatcher
  /** Names of the groups that consume a topic (a topic created by a follower). */
  groupsForTopic(topicName: string): Promise<string[]>
  log: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void; error(obj: object, msg: string): void }
  /** Told when the role changes (metrics). */
  onRole?(role: Role): void
  /** How often the leader reconciles, ms (tests shorten it). */
  reconcileEveryMs?: number
}

/** The leadership of this process, and the face of the pushing side to the services. */
export class Leadership {
  /** This term's dispatcher while this process leads (it leads exactly while there is one). */
  private term: Dispatcher | undefined
  /** The term's dispatcher has loaded its groups: until then acks and seeks get 503, not `unknown`. */
  private termReady = false
  private conn: LeaderConnection | undefined
  private url: string | null = null
  private timer: NodeJS.Timeout | undefined
  private campaigning: Promise<void> | undefined
  private stopped = false
  /** A follower's appends not yet notified: "topicId:partition" → end offset. */
  private pendingAppends = new Map<string, number>()
  private flushScheduled = false
  private knownLeader: { url: string | null; atMs: number } | undefined
  private reconciledAtMs = 0
  /** The term whose reconciliation is under way, if any: one at a time per term (an old term's may hang). */
  private reconciling: Dispatcher | undefined

  constructor(private readonly deps: LeadershipDeps) {}

  get isLeader(): boolean {
    return this.term !== undefined
  }

  /** Starts campaigning (or, embedded, leads at once). `url`: where followers can forward calls. */
  async start(url: string | null): Promise<void> {
    this.url = url
    if (this.deps.connectionString === null) {
      await this.beginTerm()
      return
    }
    await this.campaign()
    this.schedule()
  }

  /** The address became known (after listen): recorded at once if leading. */
  async advertise(url: string | null): Promise<void> {
    this.url = url
    if (this.term && this.conn && !this.conn.isLost) {
      await this.conn.record(url).catch((err: unknown) => this.deps.log.warn({ err }, 'recording the leader URL failed'))
    }
  }

  /** Stops pushing and gives up the lock: a follower takes over within its poll. */
  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    await this.campaigning?.catch(() => {})
    await this.detachTerm()?.stop()
    await this.conn?.close()
    await this.flushAppends().catch(() => {})
  }

  /** A heartbeat (or a query) taking longer than this ends the leader's term: it may have lost the lock. */
  private get queryTimeoutMs(): number {
    return Math.max(2000, 4 * this.deps.pollMs)
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      const step = this.term ? this.keepLeading() : this.campaign()
      void step.finally(() => this.schedule())
    }, this.deps.pollMs)
    this.timer.unref()
  }

  /**
   * The leader's poll: a heartbeat on the lock session (a session that stopped answering may have
   * been ended by the server and the lock given to another process: stop pushing now), and now and
   * then a reconciliation that catches what a lost NOTIFY did not tell.
   */
  private async keepLeading(): Promise<void> {
    const conn = this.conn
    const term = this.term
    if (!conn || !term) return
    try {
      await conn.heartbeat()
    } catch (err) {
      this.deps.log.warn({ err }, 'the leader session did not answer its heartbeat: pushing stops here')
      conn.destroy()
      this.lost(conn, err as Error)
      return
    }
    // Not awaited: a reconciliation runs on the pool, whose queries a silent cut hangs for as long
    // as TCP takes to give up; the heartbeats must go on meanwhile, since they are what notices it.
    if (this.termReady && this.reconciling !== term && Date.now() - this.reconciledAtMs >= (this.deps.reconcileEveryMs ?? RECONCILE_EVERY_MS)) {
      this.reconciledAtMs = Date.now()
      this.reconciling = term
      void term.reconcile()
        .catch((err: unknown) => this.deps.log.warn({ err }, 'reconciling with the database failed; trying again later'))
        .finally(() => { if (this.reconciling === term) this.reconciling = undefined })
    }
  }

  private campaign(): Promise<void> {
    if (this.term || this.stopped) return Promise.resolve()
    this.campaigning ??= this.tryLead().finally(() => { this.campaigning = undefined })
    return this.campaigning
  }

  private async tryLead(): Promise<void> {
    try {
      if (!this.conn || this.conn.isLost) {
        // The server drops a silent holder only after the holder would have given up by itself.
        this.conn = await LeaderConnection.open(this.deps.connectionString!,
          { queryTimeoutMs: this.queryTimeoutMs, idleTimeoutMs: 2 * this.queryTimeoutMs + this.deps.pollMs },
          (channel, payload) => this.onNotify(channel, payload))
        const conn = this.conn
        conn.onLost((err) => this.lost(conn, err))
      }
      if (!(await this.conn.tryLock())) return
      await this.conn.listen([APPEND_CHANNEL, CHANGE_CHANNEL])
      await this.conn.record(this.url)
      await this.beginTerm()
    } catch (err) {
      this.deps.log.warn({ err }, 'taking the leadership failed; trying again')
      // Whatever was taken goes with the session.
      await this.conn?.close()
      this.conn = undefined
      this.endTerm()
    }
  }

  private async beginTerm(): Promise<void> {
    const dispatcher = this.deps.newDispatcher()
    // The term receives notifications from now on (appends merge into what start() reads), but
    // serves acks only once started: before, it knows no group and would answer every id unknown.
    this.term = dispatcher
    this.termReady = false
    await dispatcher.start()
    // The session may have been lost while the term was starting: then it has ended already.
    if (this.term !== dispatcher) return
    this.termReady = true
    this.reconciledAtMs = Date.now() // start() has just read everything
    this.deps.log.info({ url: this.url }, 'leading: this process pushes for the database')
    this.deps.onRole?.('leader')
  }

  /** Ends the term here, returning its dispatcher for the caller to stop. */
  private detachTerm(): Dispatcher | undefined {
    const term = this.term
    if (this.termReady) this.deps.onRole?.('follower')
    this.term = undefined
    this.termReady = false
    return term
  }

  private endTerm(): void {
    // Not awaited to the end: its pending completion writes may wait on a database that is gone.
    void this.detachTerm()?.stop().catch((err: unknown) => this.deps.log.warn({ err }, 'stopping the old term failed'))
  }

  private lost(conn: LeaderConnection, err: Error | undefined): void {
    if (this.conn !== conn) return
    this.conn = undefined
    if (this.term && !this.stopped) {
      this.deps.log.warn({ err }, 'the leader session ended: pushing stops here until the lock is taken again')
    }
    this.endTerm()
  }

  /** Where the leader takes forwarded calls (looked up at most once a second), or null. */
  async leaderUrl(): Promise<string | null> {
    const now = Date.now()
    if (this.knownLeader && now - this.knownLeader.atMs < LEADER_URL_TTL_MS) return this.knownLeader.url
    const url = await leaderUrl(this.deps.pool)
    this.knownLeader = { url, atMs: now }
    return url
  }

  // ---- the pushing side, as the services see it ----

  private requireTerm(): Dispatcher {
    if (this.term && this.termReady) return this.term
    throw new HookqError('unavailable', this.term
      ? 'this broker process is taking over the pushing and is loading its groups; retry'
      : 'this broker process is not pushing for the database right now; retry', { retryAfterS: 1 })
  }

  hasGroup(name: string): boolean {
    return this.term?.hasGroup(name) ?? false
  }

  ack(group: string, ids: string[]): Promise<{ deliveryId: string; status: AckStatus }[]> {
    return this.requireTerm().ack(group, ids)
  }

  nack(group: string, ids: string[], delayMs: number | undefined, deadLetter: boolean): Promise<{ deliveryId: string; status: AckStatus }[]> {
    return this.requireTerm().nack(group, ids, delayMs, deadLetter)
  }

  extend(group: string, ids: string[], extendMs: number): Promise<{ deliveryId: string; status: AckStatus }[]> {
    return this.requireTerm().extend(group, ids, extendMs)
  }

  seek(...args: Parameters<Dispatcher['seek']>): ReturnType<Dispatcher['seek']> {
    return this.requireTerm().seek(...args)
  }

  inFlight(groupId: number, partition: number): number {
    return this.term?.inFlight(groupId, partition) ?? 0
  }

  pushWindows(): ReturnType<Dispatcher['pushWindows']> {
    return this.term?.pushWindows() ?? []
  }

  /** A group or its consumers changed here: reload it, or tell the leader to. */
  async groupChanged(name: string): Promise<void> {
    if (this.term) return this.term.reload(name)
    await this.tell({ group: name })
  }

  async topicCreated(name: string): Promise<void> {
    if (this.term) {
      for (const g of await this.deps.groupsForTopic(name)) await this.term.reload(g)
      return
    }
    await this.tell({ topicCreated: name })
  }

  async topicDeleted(id: number): Promise<void> {
    if (this.term) return this.term.topicDeleted(id)
    await this.tell({ topicDeleted: id })
  }

  /** Produce committed up to `endOffset`: wake the term (handing it the messages), or notify the leader (batched per tick). */
  appended(topicId: number, partition: number, endOffset: number, messages?: DispatchMessage[]): void {
    if (this.term) return this.term.notifyAppend(topicId, partition, endOffset, messages)
    if (this.deps.connectionString === null) return
    const key = `${topicId}:${partition}`
    if (endOffset > (this.pendingAppends.get(key) ?? -1)) this.pendingAppends.set(key, endOffset)
    if (this.flushScheduled) return
    this.flushScheduled = true
    setImmediate(() => {
      this.flushScheduled = false
      this.flushAppends().catch((err: unknown) => this.deps.log.warn({ err }, 'notifying the leader of appends failed; it reads them at its next term or append'))
    })
  }

  private async flushAppends(): Promise<void> {
    if (this.pendingAppends.size === 0) return
    const entries = [...this.pendingAppends].map(([k, end]) => `${k}:${end}`)
    this.pendingAppends.clear()
    let payload = ''
    for (const e of entries) {
      if (payload.length + e.length + 1 > MAX_PAYLOAD_BYTES) {
        await this.notify(APPEND_CHANNEL, payload)
        payload = ''
      }
      payload = payload ? `${payload};${e}` : e
    }
    if (payload) await this.notify(APPEND_CHANNEL, payload)
  }

  private async tell(change: Change): Promise<void> {
    if (this.deps.connectionString === null) return
    await this.notify(CHANGE_CHANNEL, JSON.stringify(change))
  }

  /**
   * NOTIFY on the follower's own lock session when it has one (no wait for a pool connection
   * behind queued calls), else through the pool. Best effort either way: the leader's periodic
   * reconciliation catches what a lost notification did not tell.
   */
  private async notify(channel: string, payload: string): Promise<void> {
    const conn = this.conn
    if (conn && !conn.isLost) {
      try {
        await conn.notify(channel, payload)
        return
      } catch {
        // fall through to the pool
      }
    }
    await publish(this.deps.pool, channel, payload)
  }

  private onNotify(channel: string, payload: string): void {
    const term = this.term
    if (!term) return
    if (channel === APPEND_CHANNEL) {
      for (const part of payload.split(';')) {
        const [t, p, end] = part.split(':').map(Number)
        if (Number.isSafeInteger(t) && Number.isSafeInteger(p) && Number.isSafeInteger(end)) term.notifyAppend(t!, p!, end!)
      }
      return
    }
    if (channel !== CHANGE_CHANNEL) return
    let change: Change
    try {
      change = JSON.parse(payload) as Change
    } catch {
      return
    }
    const done = 'group' in change ? term.reload(change.group)
      : 'topicCreated' in change ? this.topicCreated(change.topicCreated)
        : Promise.resolve(term.topicDeleted(change.topicDeleted))
    done.catch((err: unknown) => this.deps.log.error({ err, change }, 'applying a change a follower made failed'))
  }
}

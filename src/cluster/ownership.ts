/**
 * Every broker process on a database pushes: each (group, partition) is owned by exactly one live
 * process at a time, and the partitions spread evenly over the live ones.
 *
 *   not held ──lock taken, epoch claimed, progress loaded──▶ owned (this dispatcher pushes it)
 *      ▲                                                        │
 *      └── handed over (graceful) / session lost (at once) ─────┘
 *
 * - A process is a member while its own session holds the members' lock; owning a partition is
 *   holding its advisory lock on that session (src/store/membership.ts). The server frees the locks
 *   of a session that ends, so a killed process's partitions are free at once, and a frozen or cut
 *   off one's when idle_session_timeout ends its session; by then it has stopped by itself, since
 *   every poll is a query on that session and one left unanswered drops everything it owned.
 * - Every poll (HOOKQ_CLUSTER_POLL_MS) each member reads the live members and holders and computes
 *   the same target (src/cluster/ownership-plan.ts). It hands over what it holds beyond its share and
 *   takes what is its share and free, so a member that joins, leaves or dies is balanced within two
 *   polls, and partitions that need not move do not.
 * - The lock says who may take a partition; the owner epoch fences the writes: a new owner bumps
 *   it, and completions, reservations and retries name the epoch they hold, so a process that lost a
 *   partition (paused past its session, say) has its writes refused by the database.
 * - Moves run beside the polls, never holding them up: a poll is also the session's heartbeat.
 * - The lock is lost with the session, which the server ends only after it sat idle for
 *   idle_session_timeout; a process stopped (SIGSTOP, a VM paused, a starved event loop) may wake
 *   long after, with timers due to push. So a push goes out only while this process holds a lease
 *   it can prove locally, without a round trip: the last query answered on the session was sent
 *   less than `leaseMs` ago (a query timeout short of the server's idle limit), by the monotonic
 *   clock and by the wall clock both (the monotonic one stops while the machine is suspended). A push made while
 *   the lease lapsed waits for the next poll: answered, the session (and its locks, which nobody
 *   else could take meanwhile) is proven and it goes; failed, everything is dropped and it goes
 *   nowhere. Everything the new owner counts (reservations, retries' rows) is written before its
 *   push, so its attempt numbers start above anything pushed here.
 *
 * With the embedded database (one connection) there is one process by construction: it owns every
 * partition, with no session and no locks, and epochs all the same.
 */
import type { Dispatcher } from '../dispatch/dispatcher.ts'
import type { PushLease } from '../dispatch/push-send.ts'
import type { Database } from '../store/db.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'
import {
  ackUnowned,
  settleUnowned,
  claimPartition,
  forgetDeadMembers,
  groupPartitions,
  holderUrl,
  MemberSession,
  ownerEpochs,
  type ClusterView,
} from '../store/membership.ts'
import { pairKey, planOwnership } from './ownership-plan.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

/** How often the members re-read groups, end offsets and owner epochs (what a lost NOTIFY did not tell), ms. */
const RECONCILE_EVERY_MS = 5000

type Log = { info(obj: object, msg: string): void; warn(obj: object, msg: string): void; error(obj: object, msg: string): void }

export interface OwnershipDeps {
  /** The database, for the session of its own; null: the embedded database (own everything, alone). */
  connectionString: string | null
  db: Database
  pollMs: number
  dispatcher: Pick<Dispatcher, 'hasGroup' | 'reload' | 'acquire' | 'release' | 'releaseAll' | 'heldEpochs' | 'reconcile' | 'owns'>
  /** Every NOTIFY heard on the session (other members' changes and appends). */
  onNotify(channel: string, payload: string): void
  /** The session (re)joined and listens again: what was notified while it was down went unheard. */
  onJoined?(): void
  log: Log
  /** Told how many partitions this process owns whenever that changes (metrics). */
  onOwned?(count: number): void
  /** The backoff before a nacked attempt goes again (undefined: the group is not loaded here). */
  retryDelayMs?(groupName: string, attempt: number): number | undefined
  /** How often to reconcile, ms (tests shorten it). */
  reconcileEveryMs?: number
}

interface Held {
  groupId: number
  name: string
  partition: number
}

/** What a process must do with the partitions' locks: a session's, or none when alone. */
interface Locks {
  tryLock(groupId: number, partition: number): Promise<boolean>
  unlock(groupId: number, partition: number): Promise<void>
  readonly isLost: boolean
}
interface ViewIndex {
  groups: Map<string, ClusterView['groups'][number]>
  /** "groupId:partition" → the holder's backend pid. */
  holders: Map<string, number>
  /** Backend pid → the member's URL. */
  urls: Map<number, string>
}
const EMPTY_INDEX: ViewIndex = { groups: new Map(), holders: new Map(), urls: new Map() }

const ALONE: Locks = { tryLock: async () => true, unlock: async () => {}, isLost: false }

/** A member session's timeouts, from the poll interval (see MemberSession.open and the lease above). */
function sessionTimeouts(pollMs: number): { queryTimeoutMs: number; idleTimeoutMs: number; leaseMs: number } {
  const queryTimeoutMs = Math.max(2000, 4 * pollMs)
  // The server drops a silent member only after the member would have given up by itself.
  const idleTimeoutMs = 2 * queryTimeoutMs + pollMs
  return { queryTimeoutMs, idleTimeoutMs, leaseMs: idleTimeoutMs - queryTimeoutMs }
}

export class Ownership {
  private session: MemberSession | undefined
  /** Pushes waiting for the lease to be proven again (or lost). */
  private leaseWaiters: (() => void)[] = []
  /** Checked before each push (see the lease above); the dispatcher holds it. */
  readonly lease: PushLease = {
    held: () => this.leaseHeld(),
    wait: (fn) => {
      if (this.leaseHeld()) fn()
      else this.leaseWaiters.push(fn)
    },
  }
  private view: ClusterView | undefined
  /** The last view by name and key, for routing each call without a scan. */
  private index: ViewIndex = EMPTY_INDEX
  /** Partitions whose lock this process holds ("groupId:partition"). */
  private readonly held = new Map<string, Held>()
  /** Partitions being taken, handed over or claimed again: one move at a time each. */
  private readonly moving = new Map<string, Promise<void>>()
  /** Partitions being taken (locked, loading), with the move that loads them. */
  private readonly taking = new Map<string, Promise<void>>()
  private url: string | null = null
  private timer: NodeJS.Timeout | undefined
  private polling: Promise<void> | undefined
  private pollAgain = false
  private stopped = false
  private reconciledAtMs = 0
  private reconciling = false
  /** Told when ownerOf may answer otherwise (watchOwners). */
  private readonly ownerWatchers = new Set<() => void>()

  /** How long a session's last answered query proves it (see the lease above), ms. */
  private readonly leaseMs: number

  constructor(private readonly deps: OwnershipDeps) {
    this.leaseMs = sessionTimeouts(deps.pollMs).leaseMs
  }

  /**
   * Joins (or, alone, takes everything) and starts taking the first share: resolves once joined and
   * the first view is known (calls can be routed), not when the share is loaded (see `settled`).
   */
  async start(url: string | null): Promise<void> {
    this.url = url
    this.reconciledAtMs = Date.now()
    await this.poll()
    // Polls go on while the first partitions load (each poll is the session's heartbeat).
    this.schedule()
  }

  /** Resolves once the moves under way now (the first share, after start) are done, taken or not. */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.moving.values()])
  }

  /** The address became known (after listen): recorded at once. */
  async advertise(url: string | null): Promise<void> {
    this.url = url
    const s = this.session
    if (s && !s.isLost) await s.record(url).catch((err: unknown) => this.deps.log.warn({ err }, "recording this member's URL failed"))
  }

  /** Stops taking partitions and ends the session: the others take them within a poll. The caller stops the dispatcher first. */
  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    await this.polling?.catch(() => {})
    await this.session?.close()
    this.session = undefined
    this.held.clear()
    this.ownersMoved()
    this.wakeLeaseWaiters()
  }

  /** Polls again soon (a group or topic was created or deleted here). */
  pollSoon(): void {
    if (this.stopped) return
    if (this.polling) {
      this.pollAgain = true
      return
    }
    clearTimeout(this.timer)
    void this.poll().finally(() => this.schedule())
  }

  /** The session, for NOTIFY (no pool connection needed), if it is up. */
  get liveSession(): MemberSession | undefined {
    return this.session && !this.session.isLost ? this.session : undefined
  }

  /** This process's place among the members in the order of their ids, as of the last poll (for taking turns); alone when not among them. */
  get turn(): { index: number; count: number } {
    const view = this.view
    if (this.deps.connectionString === null || !view) return { index: 0, count: 1 }
    const pids = view.members.map((m) => m.pid).sort((a, b) => a - b)
    const index = pids.indexOf(view.self)
    return index < 0 ? { index: 0, count: 1 } : { index, count: pids.length }
  }

  /** How many members the last poll saw (1 alone). */
  get memberCount(): number {
    return this.deps.connectionString === null ? 1 : (this.view?.members.length ?? 1)
  }

  /**
   * Where calls for a partition go: 'self' when this process owns it, the owner's URL when another
   * live member holds it (as of the last poll), null when nobody does right now (it is moving).
   */
  ownerOf(groupName: string, partition: number): 'self' | string | null {
    if (this.deps.connectionString === null) return 'self'
    const group = this.index.groups.get(groupName)
    if (!group) return null
    // Held here, also while being handed over (its acks are still written here) or loaded.
    if (this.held.has(pairKey(group.groupId, partition)) || this.deps.dispatcher.owns(group.groupId, partition)) return 'self'
    const pid = this.index.holders.get(pairKey(group.groupId, partition))
    if (pid === undefined || pid === this.view!.self) return null
    return this.index.urls.get(pid) ?? null
  }

  /**
   * Acks of a partition nobody holds right now (moving, or its owner gone), written durably here
   * (src/store/membership.ts ackUnowned): the status of each id written, or null when the
   * partition turned out to be held (its owner answers, at the caller's retry).
   */
  async ackUnowned(groupName: string, partition: number, ids: string[]): Promise<Map<string, string> | null> {
    const group = this.index.groups.get(groupName)
    if (this.deps.connectionString === null || !group) return null
    return ackUnowned(this.deps.db, group.groupId, partition, ids)
  }

  /**
   * Nacks and extends of a partition nobody holds right now, written durably here like acks
   * (src/store/membership.ts settleUnowned): the status of each id written, or null when the
   * partition turned out to be held, or the call needs its owner (a dead letter is produced by the
   * owner; a nack without a delay needs the group's backoff, known only where the group is loaded).
   */
  async settleUnowned(
    verb: 'nacks' | 'extend',
    groupName: string,
    partition: number,
    ids: string[],
    body: { delayMs?: number; deadLetter?: boolean; extendMs?: number },
  ): Promise<Map<string, string> | null> {
    const group = this.index.groups.get(groupName)
    if (this.deps.connectionString === null || !group) return null
    const now = Date.now()
    if (verb === 'extend') {
      const to = now + (body.extendMs ?? 0)
      return settleUnowned(this.deps.db, group.groupId, partition, ids, { verb: 'extend', untilMs: () => to })
    }
    if (body.deadLetter) return null
    const delays = new Map<string, number>()
    for (const id of ids) {
      const delay = body.delayMs ?? this.deps.retryDelayMs?.(groupName, parseDeliveryId(id)?.attempt ?? 1)
      if (delay === undefined) return null
      delays.set(id, delay)
    }
    return settleUnowned(this.deps.db, group.groupId, partition, ids, { verb: 'nack', untilMs: (id) => now + delays.get(id)! })
  }

  /** The URL of the process holding the partition now, read from the database (the last poll's view may be stale). */
  async holderNow(groupName: string, partition: number): Promise<string | null> {
    const group = this.index.groups.get(groupName)
    if (this.deps.connectionString === null || !group) return null
    return holderUrl(this.deps.db.pool, group.groupId, partition)
  }

  /**
   * Calls `fn` whenever ownerOf may answer otherwise for some partition: a poll saw other holders
   * (or members' URLs), or this process took or let go of a partition. A long poll waiting on the
   * owners it saw gathers again (src/service/acks.ts pull). Returns the unwatch.
   */
  watchOwners(fn: () => void): () => void {
    this.ownerWatchers.add(fn)
    return () => {
      this.ownerWatchers.delete(fn)
    }
  }

  private ownersMoved(): void {
    for (const fn of [...this.ownerWatchers]) {
      try {
        fn()
      } catch (err) {
        // A watcher's failure is its own pull's; the move goes on.
        this.deps.log.warn({ err }, 'telling a waiting pull that partitions moved failed')
      }
    }
  }

  /** The partition count of a group, as of the last poll (undefined: not known here). */
  partitionsOf(groupName: string): number | undefined {
    return this.index.groups.get(groupName)?.partitions
  }

  /** True when no other member was seen at the last poll: nothing to route elsewhere. */
  get alone(): boolean {
    return this.memberCount <= 1
  }

  /**
   * A partition this process holds must be loaded again with a new epoch: it was seeked, or a write
   * was refused for its epoch while the lock is still ours (a seek elsewhere moved it on).
   */
  refresh(name: string, partition: number): Promise<void> {
    const h = [...this.held.values()].find((x) => x.name === name && x.partition === partition)
    const locks = this.locks()
    if (!h || !locks) return Promise.resolve()
    return this.move(pairKey(h.groupId, partition), async () => {
      await this.deps.dispatcher.release(name, partition, false)
      await this.claim(locks, h)
    })
  }

  private schedule(): void {
    if (this.stopped) return
    clearTimeout(this.timer)
    this.timer = setTimeout(() => {
      void this.poll().finally(() => this.schedule())
    }, timerDelayMs(this.deps.pollMs))
    this.timer.unref()
  }

  private poll(): Promise<void> {
    this.polling ??= this.pollOnce().finally(() => {
      this.polling = undefined
      if (this.pollAgain && !this.stopped) {
        this.pollAgain = false
        this.pollSoon()
      }
    })
    return this.polling
  }

  private async pollOnce(): Promise<void> {
    if (this.stopped) return
    if (this.deps.connectionString === null) {
      try {
        const groups = await groupPartitions(this.deps.db.pool)
        const holders = [...this.held.values()].map((h) => ({ groupId: h.groupId, partition: h.partition, pid: 0 }))
        this.setView({ self: 0, members: [{ pid: 0, url: null }], holders, groups })
        this.balance(ALONE, this.view!)
      } catch (err) {
        this.deps.log.warn({ err }, 'reading the groups failed; trying again at the next poll')
      }
      this.maybeReconcile()
      return
    }
    let session = this.session
    try {
      if (!session || session.isLost) session = await this.join()
      const view = await session.view()
      if (session !== this.session || this.stopped) return
      this.setView(view)
      this.wakeLeaseWaiters()
      this.balance(session, view)
    } catch (err) {
      this.deps.log.warn({ err }, 'the member session did not answer: this process stops pushing until it joins again')
      if (session) {
        session.destroy()
        this.lost(session)
      }
      return
    }
    this.maybeReconcile()
  }

  private async join(): Promise<MemberSession> {
    const { queryTimeoutMs, idleTimeoutMs } = sessionTimeouts(this.deps.pollMs)
    const session = await MemberSession.open(this.deps.connectionString!, { queryTimeoutMs, idleTimeoutMs }, (channel, payload) =>
      this.deps.onNotify(channel, payload),
    )
    session.onLost(() => this.lost(session))
    try {
      await session.join(this.url)
    } catch (err) {
      await session.close()
      throw err
    }
    this.session = session
    this.deps.log.info({ url: this.url, backendPid: session.pid }, 'joined the broker processes of this database')
    this.deps.onJoined?.()
    return session
  }

  /** The session ended: every lock on it is gone, so is every partition (another may push them now). */
  private lost(session: MemberSession): void {
    if (this.session !== session) return
    this.session = undefined
    this.setView(undefined)
    if (this.held.size > 0 && !this.stopped)
      this.deps.log.warn({ partitions: this.held.size }, 'the member session ended: this process stops pushing its partitions')
    this.held.clear()
    this.ownersMoved()
    this.deps.dispatcher.releaseAll()
    this.deps.onOwned?.(0)
    // Dropped now: what waited for the lease goes nowhere.
    this.wakeLeaseWaiters()
  }

  /** True while a push may go out (see the lease above): alone always, else while the session is proven recent enough. */
  private leaseHeld(): boolean {
    if (this.deps.connectionString === null) return true
    const s = this.session
    if (s === undefined || s.isLost || performance.now() - s.provenAtMs >= this.leaseMs) return false
    // The wall clock too: the monotonic one stops while the machine sleeps. A wall clock stepped
    // forward only makes a push wait for the next poll; stepped back, the monotonic check still holds.
    const wallAgeMs = Date.now() - s.provenAtWallMs
    return wallAgeMs < this.leaseMs
  }

  /** Runs the pushes that waited for the lease: each sends if it may now, or gives up (its partition dropped). */
  private wakeLeaseWaiters(): void {
    if (this.leaseWaiters.length === 0) return
    const waiters = this.leaseWaiters
    this.leaseWaiters = []
    for (const fn of waiters) fn()
  }

  private setView(view: ClusterView | undefined): void {
    const before = this.index
    this.view = view
    this.index =
      view === undefined
        ? EMPTY_INDEX
        : {
            groups: new Map(view.groups.map((g) => [g.name, g])),
            holders: new Map(view.holders.map((h) => [pairKey(h.groupId, h.partition), h.pid])),
            urls: new Map(view.members.flatMap((m) => (m.url === null ? [] : [[m.pid, m.url] as const]))),
          }
    const after = this.index
    if (
      this.ownerWatchers.size > 0 &&
      (!sameEntries(before.holders, after.holders) ||
        !sameEntries(before.urls, after.urls) ||
        !sameEntries(before.groups, after.groups, (x, y) => x.groupId === y.groupId && x.partitions === y.partitions))
    )
      this.ownersMoved()
  }

  private locks(): Locks | undefined {
    if (this.deps.connectionString === null) return ALONE
    return this.session && !this.session.isLost ? this.session : undefined
  }

  /** Hands over what is beyond this member's share, takes what is its share and free. */
  private balance(locks: Locks, view: ClusterView): void {
    const target = planOwnership(view)
    const holderOf = this.index.holders
    for (const [k, h] of this.held) {
      if (this.moving.has(k)) continue
      if (target.get(k) !== view.self) this.move(k, () => this.handOver(locks, k, h))
      // Held, but the dispatcher let it go (its group was loaded again for a new topic): claim it again.
      else if (!this.deps.dispatcher.owns(h.groupId, h.partition)) void this.refresh(h.name, h.partition)
    }
    for (const g of view.groups) {
      for (let p = 0; p < g.partitions; p++) {
        const k = pairKey(g.groupId, p)
        if (target.get(k) !== view.self || this.held.has(k) || this.moving.has(k)) continue
        // Held by another member that has yet to hand it over (it will, at its next poll).
        const holder = holderOf.get(k)
        if (holder !== undefined && holder !== view.self) continue
        this.move(k, () => this.take(locks, { groupId: g.groupId, name: g.name, partition: p }))
      }
    }
  }

  private move(k: string, fn: () => Promise<void>): Promise<void> {
    const previous = this.moving.get(k) ?? Promise.resolve()
    const next = previous
      .then(fn)
      .catch((err: unknown) => this.deps.log.error({ err, partition: k }, 'moving a partition failed; the next poll tries again'))
      .finally(() => {
        if (this.moving.get(k) === next) this.moving.delete(k)
        this.deps.onOwned?.(this.held.size)
      })
    this.moving.set(k, next)
    return next
  }

  private async take(locks: Locks, h: Held): Promise<void> {
    if (this.stopped || locks.isLost || !(await locks.tryLock(h.groupId, h.partition))) return
    const k = pairKey(h.groupId, h.partition)
    this.held.set(k, h)
    this.ownersMoved()
    const claimed = this.claim(locks, h)
    this.taking.set(k, claimed)
    try {
      await claimed
    } finally {
      if (this.taking.get(k) === claimed) this.taking.delete(k)
    }
  }

  /**
   * Waits, at most `maxMs`, for the partitions of these delivery ids that this process is taking
   * right now to be loaded: their acks are then answered, instead of 503 while loading.
   */
  async loaded(groupName: string, partitions: () => Iterable<number>, maxMs: number): Promise<void> {
    if (this.taking.size === 0) return
    const group = this.index.groups.get(groupName)
    if (!group) return
    const waits: Promise<void>[] = []
    for (const p of new Set(partitions())) {
      const w = this.taking.get(pairKey(group.groupId, p))
      if (w) waits.push(w)
    }
    if (waits.length === 0) return
    let timer: NodeJS.Timeout | undefined
    await Promise.race([Promise.allSettled(waits), new Promise<void>((resolve) => (timer = setTimeout(resolve, maxMs)))])
    clearTimeout(timer)
  }

  /** With the lock held: a new epoch, then the dispatcher loads the partition under it. */
  private async claim(locks: Locks, h: Held): Promise<void> {
    const k = pairKey(h.groupId, h.partition)
    try {
      if (!this.deps.dispatcher.hasGroup(h.name)) await this.deps.dispatcher.reload(h.name)
      const epoch = await claimPartition(this.deps.db.pool, h.groupId, h.partition)
      if (locks.isLost || this.stopped || this.held.get(k) !== h) return
      if (epoch !== null && (await this.deps.dispatcher.acquire(h.name, h.partition, epoch))) {
        // The session may have been lost while loading: then the partition is not ours to push.
        if (locks.isLost || this.held.get(k) !== h) await this.deps.dispatcher.release(h.name, h.partition, false)
        return
      }
      // The group or its topic is gone (or not running here yet): let go, the next poll sees.
      await this.letGo(locks, k, h)
    } catch (err) {
      await this.letGo(locks, k, h).catch(() => {})
      throw err
    }
  }

  private async handOver(locks: Locks, k: string, h: Held): Promise<void> {
    await this.deps.dispatcher.release(h.name, h.partition, true)
    await this.letGo(locks, k, h)
  }

  private async letGo(locks: Locks, k: string, h: Held): Promise<void> {
    if (this.held.get(k) !== h) return
    this.held.delete(k)
    this.ownersMoved()
    if (locks.isLost) return
    try {
      await locks.unlock(h.groupId, h.partition)
    } catch (err) {
      // A lock we cannot give back is one we can no longer account for: start over on a new session.
      this.deps.log.warn({ err }, 'giving a partition lock back failed: this process joins again')
      if (this.session && locks === this.session) {
        this.session.destroy()
        this.lost(this.session)
      }
    }
  }

  /** Now and then, not awaited: groups and end offsets reloaded, and partitions whose epoch moved (a seek elsewhere) claimed again. */
  private maybeReconcile(): void {
    if (this.reconciling || Date.now() - this.reconciledAtMs < (this.deps.reconcileEveryMs ?? RECONCILE_EVERY_MS)) return
    this.reconciledAtMs = Date.now()
    this.reconciling = true
    const run = async () => {
      await this.deps.dispatcher.reconcile()
      const held = this.deps.dispatcher.heldEpochs()
      const now = await ownerEpochs(
        this.deps.db.pool,
        held.map((h) => h.key),
      )
      for (const h of held) {
        if (this.moving.has(pairKey(h.key.groupId, h.key.partition))) continue
        const epoch = now.get(pairKey(h.key.groupId, h.key.partition))
        if (epoch !== undefined && epoch !== h.ownerEpoch) void this.refresh(h.name, h.key.partition)
      }
      if (this.deps.connectionString !== null) await forgetDeadMembers(this.deps.db.pool)
    }
    void run()
      .catch((err: unknown) => this.deps.log.warn({ err }, 'reconciling with the database failed; trying again later'))
      .finally(() => {
        this.reconciling = false
      })
  }
}

/** Whether two maps hold the same keys with equal values. */
function sameEntries<K, V>(a: ReadonlyMap<K, V>, b: ReadonlyMap<K, V>, equal: (x: V, y: V) => boolean = Object.is): boolean {
  if (a.size !== b.size) return false
  for (const [k, v] of a) {
    if (!b.has(k) || !equal(v, b.get(k)!)) return false
  }
  return true
}

/**
 * This process among the broker processes of its database, as the services see it: its dispatcher
 * pushes the partitions it owns (src/cluster/ownership.ts), and what one process changes reaches
 * the others.
 *
 * - Acks, nacks and extend reach the owner of each delivery's partition: src/http/forward.ts sends
 *   each owner its ids, and the dispatcher answers a call for a partition it does not push (it
 *   moved since) with 503 and Retry-After, never `unknown`.
 * - A seek is written by whichever process takes it, with a new owner epoch for each partition it
 *   moves (src/store/consumption.ts seekOffsets): the owner can write nothing more from before it,
 *   and claims the partition again when told (NOTIFY), at its next refused write, or at its next
 *   reconciliation, whichever comes first.
 * - Produce, group and topic changes are applied here and told to the other members with NOTIFY
 *   (appends batched per tick), only when there are others.
 */
import type { AckStatus, Dispatcher } from '../dispatch/dispatcher.ts'
import { HookqError } from '../core/errors.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import { seekOffsets } from '../store/consumption.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'
import { APPEND_CHANNEL, CHANGE_CHANNEL, MAX_PAYLOAD_BYTES, OUTBOX_CHANNEL, publish, type OutboxWait } from '../store/membership.ts'
import { Ownership, type OwnershipDeps } from './ownership.ts'

/** What one member tells the others changed. */
type Change = { group: string } | { topicCreated: string } | { topicDeleted: number } | { seek: { group: string; partitions: number[] } }

type Results = Promise<{ deliveryId: string; status: AckStatus }[]>

/** How long an ack, nack or extend waits for a partition this process is taking over to load, ms (then 503, asked again). */
const TAKING_WAIT_MS = 2000

export interface ClusterDeps extends Omit<OwnershipDeps, 'onNotify' | 'dispatcher' | 'onOwned'> {
  dispatcher: Dispatcher
  /** Names of the groups that consume a topic (a topic created by another member). */
  groupsForTopic(topicName: string): Promise<string[]>
  /** Told how many partitions this process owns (metrics). */
  onOwned?(count: number): void
}

export class Cluster {
  readonly ownership: Ownership
  private readonly dispatcher: Dispatcher
  /** Appends not yet told to the other members: "topicId:partition" → end offset. */
  private pendingAppends = new Map<string, number>()
  private flushScheduled = false
  private outboxWake: (() => void) | undefined

  constructor(private readonly deps: ClusterDeps) {
    this.dispatcher = deps.dispatcher
    this.ownership = new Ownership({
      ...deps,
      dispatcher: deps.dispatcher,
      onOwned: deps.onOwned,
      retryDelayMs: (name, attempt) => deps.dispatcher.retryDelayMs(name, attempt),
      onNotify: (channel, payload) => this.onNotify(channel, payload),
      onJoined: () => this.outboxWake?.(),
    })
  }

  /**
   * Whether hookq_produce() commits are heard (on the member session; not on the embedded database
   * or a pool of one, which have no session of their own).
   */
  get hearsOutbox(): boolean {
    return this.deps.connectionString !== null
  }

  /**
   * This process is about to wait for hookq_produce() commits: takes the wait lock on the member
   * session, so that committers NOTIFY (see OutboxWait; 'none': no session up, nothing is heard).
   */
  async waitForOutbox(): Promise<OutboxWait | 'none'> {
    const session = this.ownership.liveSession
    if (!session) return 'none'
    try {
      return await session.waitForOutbox()
    } catch {
      return 'none' // the session is failing: its rejoin wakes the mover
    }
  }

  /** This process is moving rows: committers need not NOTIFY on its account. */
  async stopWaitingForOutbox(): Promise<void> {
    await this.ownership.liveSession?.stopWaitingForOutbox().catch(() => {})
  }

  /** `wake` runs at every hookq_produce() commit heard, and whenever the session (re)joins (commits may have gone unheard). */
  onOutboxRows(wake: () => void): void {
    this.outboxWake = wake
  }

  /**
   * Loads the groups, joins the other processes and takes this one's share of the partitions; with
   * `loadInBackground` it resolves once joined, while the share is still being loaded.
   */
  async start(url: string | null, loadInBackground = false): Promise<void> {
    await this.dispatcher.start()
    await this.ownership.start(url)
    if (!loadInBackground) await this.ownership.settled()
  }

  advertise(url: string | null): Promise<void> {
    return this.ownership.advertise(url)
  }

  /** Stops pushing (completions queued are written), then leaves: the others take the partitions over. */
  async stop(): Promise<void> {
    await this.dispatcher.stop()
    await this.ownership.stop()
    await this.flushAppends().catch(() => {})
  }

  // ---- the pushing side, as the services see it ----

  hasGroup(name: string): boolean {
    return this.dispatcher.hasGroup(name)
  }

  /** Callers of pull waiting on this process for the group. */
  pullWaiters(name: string): number {
    return this.dispatcher.pullWaiters(name)
  }

  deliveryOf(name: string): 'push' | 'pull' | undefined {
    return this.dispatcher.deliveryOf(name)
  }

  /** Leases from the partitions this process owns (the HTTP layer gathers from the other owners: src/http/forward.ts). */
  pull(group: string, opts: { maxMessages: number; waitMs: number; leaseMs: number | undefined }, signal?: AbortSignal): Promise<string[]> {
    this.requireLoaded(group)
    return this.dispatcher.pull(group, opts, signal)
  }

  /** Leases whose caller went away before they reached it: leasable again at once (those of partitions owned here). */
  giveBack(group: string, deliveryIds: string[]): void {
    this.dispatcher.giveBack(group, deliveryIds)
  }

  /** Waits until a message could be leased from the partitions this process owns, leasing none (dispatcher.ts probe). */
  probe(group: string, waitMs: number, signal?: AbortSignal): Promise<boolean> {
    this.requireLoaded(group)
    return this.dispatcher.probe(group, waitMs, signal)
  }

  async ack(group: string, ids: string[]): Results {
    this.requireLoaded(group)
    await this.ownership.loaded(group, () => partitionsOf(ids), TAKING_WAIT_MS)
    return this.dispatcher.ack(group, ids)
  }

  async nack(group: string, ids: string[], delayMs: number | undefined, deadLetter: boolean): Results {
    this.requireLoaded(group)
    await this.ownership.loaded(group, () => partitionsOf(ids), TAKING_WAIT_MS)
    return this.dispatcher.nack(group, ids, delayMs, deadLetter)
  }

  async extend(group: string, ids: string[], extendMs: number): Results {
    this.requireLoaded(group)
    await this.ownership.loaded(group, () => partitionsOf(ids), TAKING_WAIT_MS)
    return this.dispatcher.extend(group, ids, extendMs)
  }

  /**
   * A group that exists but is not loaded here yet (just created by another process) would answer
   * every id `unknown`: its owners answer instead. (Ids of partitions owned elsewhere are the
   * dispatcher's to refuse: it tells them from its own.)
   */
  private requireLoaded(group: string): void {
    if (!this.dispatcher.hasGroup(group) && this.ownership.partitionsOf(group) !== undefined) throw moving()
  }

  /** Moves committed offsets; the partitions' owners (here or elsewhere) load them again from there. */
  async seek(group: { name: string; id: number }, topicId: number, offsets: Map<number, number>): Promise<void> {
    await seekOffsets(this.deps.db, group.id, topicId, offsets, Date.now())
    const partitions = [...offsets.keys()]
    // Those owned here are loaded again before the answer, as the seek's caller expects.
    await Promise.all(partitions.map((p) => this.ownership.refresh(group.name, p)))
    await this.tell({ seek: { group: group.name, partitions } })
  }

  inFlight(groupId: number, partition: number): number {
    return this.dispatcher.inFlight(groupId, partition)
  }

  pushWindows(): ReturnType<Dispatcher['pushWindows']> {
    return this.dispatcher.pushWindows()
  }

  /** A group or its consumers changed here: reload it, and tell the others. */
  async groupChanged(name: string): Promise<void> {
    await this.dispatcher.reload(name)
    this.pollIfPartitionsChanged(name)
    await this.tell({ group: name })
  }

  async topicCreated(name: string): Promise<void> {
    const groups = await this.deps.groupsForTopic(name)
    for (const g of groups) await this.dispatcher.reload(g)
    if (groups.length > 0) this.ownership.pollSoon()
    await this.tell({ topicCreated: name })
  }

  /**
   * A poll reads every group and balances them all: worth it at once only when the group's
   * partitions came, went or changed in number (created, deleted, its topic recreated), not for a
   * consumer or a setting (creating 2,000 groups with a consumer each polled 3 times a group).
   * Anything else is seen by the next regular poll.
   */
  private pollIfPartitionsChanged(name: string): void {
    if (this.ownership.partitionsOf(name) !== this.dispatcher.partitionCount(name)) this.ownership.pollSoon()
  }

  async topicDeleted(id: number): Promise<void> {
    this.dispatcher.topicDeleted(id)
    this.ownership.pollSoon()
    await this.tell({ topicDeleted: id })
  }

  /** Produce committed up to `endOffset`: wake the dispatcher (handing it the messages), and tell the others (batched per tick). */
  appended(topicId: number, partition: number, endOffset: number, messages?: DispatchMessage[]): void {
    this.dispatcher.notifyAppend(topicId, partition, endOffset, messages)
    if (this.ownership.memberCount < 2) return
    const key = `${topicId}:${partition}`
    if (endOffset > (this.pendingAppends.get(key) ?? -1)) this.pendingAppends.set(key, endOffset)
    if (this.flushScheduled) return
    this.flushScheduled = true
    setImmediate(() => {
      this.flushScheduled = false
      this.flushAppends().catch((err: unknown) =>
        this.deps.log.warn({ err }, 'telling the other processes of appends failed; they read them at their next reconciliation'),
      )
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
    if (this.deps.connectionString === null || this.ownership.memberCount < 2) return
    await this.notify(CHANGE_CHANNEL, JSON.stringify(change))
  }

  /**
   * NOTIFY on the member session when it is up (no wait for a pool connection behind queued calls),
   * else through the pool. Best effort either way: the others' reconciliation catches what a lost
   * notification did not tell.
   */
  private async notify(channel: string, payload: string): Promise<void> {
    const session = this.ownership.liveSession
    if (session) {
      try {
        await session.notify(channel, payload)
        return
      } catch {
        // fall through to the pool
      }
    }
    await publish(this.deps.db.pool, channel, payload)
  }

  private onNotify(channel: string, payload: string): void {
    if (channel === OUTBOX_CHANNEL) {
      this.outboxWake?.()
      return
    }
    if (channel === APPEND_CHANNEL) {
      for (const part of payload.split(';')) {
        const [t, p, end] = part.split(':').map(Number)
        if (Number.isSafeInteger(t) && Number.isSafeInteger(p) && Number.isSafeInteger(end)) this.dispatcher.notifyAppend(t!, p!, end!)
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
    const apply = async () => {
      if ('group' in change) {
        await this.dispatcher.reload(change.group)
        this.pollIfPartitionsChanged(change.group)
        return
      }
      if ('topicCreated' in change) {
        for (const g of await this.deps.groupsForTopic(change.topicCreated)) await this.dispatcher.reload(g)
      } else if ('topicDeleted' in change) this.dispatcher.topicDeleted(change.topicDeleted)
      else await Promise.all(change.seek.partitions.map((p) => this.ownership.refresh(change.seek.group, p)))
      if (!('seek' in change)) this.ownership.pollSoon()
    }
    apply().catch((err: unknown) => this.deps.log.error({ err, change }, 'applying a change another process made failed'))
  }
}

function moving(): HookqError {
  return new HookqError('unavailable', 'this group is not loaded by this broker process yet; retry', { retryAfterS: 1 })
}

function partitionsOf(ids: string[]): number[] {
  return ids.flatMap((id) => {
    const k = parseDeliveryId(id)
    return k ? [k.partition] : []
  })
}

/**
 * The dispatcher: for every (group, partition) this broker process owns, reads the partition in
 * offset order from its committed offset, pushes each message to the partition's consumer and
 * settles every attempt. This file holds what the parts share and their lifecycle; the parts:
 *
 *   partition.ts          one owned partition, the only writer of its state: messages, attempts, checked moves
 *                         (partition-log.ts: its buffer, completions and reservation)
 *   partition-reader.ts   the log into a partition's buffer (reads, produce's tail, retention gaps)
 *   push-flow.ts          a message's way: admission, push, settle, retry, dead letter, completion
 *   push-send.ts          single and batch sends and their answers (batches.ts gathers a batch)
 *   ack-handler.ts        acks, nacks and extends of delivery ids
 *   progress.ts           completions and push reservations, written together, fenced by epoch
 *   schedule.ts           ack deadlines (tracker.ts, by delivery id) and waits (waits.ts), one timer
 *   consumer-windows.ts   each consumer's push window (push-window.ts), its fixed limits and who waits for them
 *   attempt-log.ts        the attempt rows, written in batches
 *   health.ts             each consumer's successes and failures, for the group status
 *   ../core/filter.ts     the group's filter, compiled (with the other pure rules in src/core/)
 *
 * A group is loaded here in full (its row, its consumers); a partition only once this process has
 * claimed it (src/cluster/ownership.ts: acquire() with the owner epoch that fences its writes) and
 * until it lets it go (release) or learns that it lost it (a write refused for its epoch, or the
 * member session gone). PostgreSQL holds the truth, so a partition's state is rebuilt from it each
 * time it is acquired, exactly as after a restart: committed offset, completions above it, the push
 * reservation, attempts made.
 *
 * Time (`now`, `timers`) and the database are injected, so test/dispatch/dispatcher.test.ts steps
 * a clock through deadlines, backoffs and races instead of sleeping.
 */
import type { Database } from '../store/db.ts'
import type { ConsumerRow, GroupRow } from '../store/groups.ts'
import { findTopicByName, listTopics, readAllEndOffsets, readEndOffsets, type TopicRow } from '../store/topics.ts'
import { attemptCounts, handBack, loadProgress, type HandBack, type PartitionKey } from '../store/consumption.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import { partitionKey, type AppendEntry, type AppendReservation, type AppendReserver } from '../store/messages.ts'
import { abandonInFlight, HANDED_OVER, handedOverInFlight } from '../store/deliveries.ts'
import type { DispatchMetrics, PushWindowStat } from '../metrics.ts'
import { AckHandler, type AckResult } from './ack-handler.ts'
import type { AttemptLog } from './attempt-log.ts'
import { ConsumerWindows } from './consumer-windows.ts'
import { HealthRecorder } from './health.ts'
import { PendingDisables } from './pending-disables.ts'
import { PartitionReader } from './partition-reader.ts'
import {
  filterOf,
  newGroupRuntime,
  newPartitionState,
  policyOf,
  type GroupRuntime,
  type Outstanding,
  type PartitionState,
} from './partition-state.ts'
import { DEFAULT_LINGER, ProgressWriter } from './progress.ts'
import { PushFlow } from './push-flow.ts'
import { PullDesk, Taker } from './pull-desk.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'
import type { PushAgent } from './pusher.ts'
import type { PushLease } from './push-send.ts'
import type { PushWindowOptions } from './push-window.ts'
import { nodeTimers, Schedule, type Timers } from './schedule.ts'
import { timerDelayMs } from '../core/timer-delay.ts'
import { nextDelayMs } from '../core/retry-policy.ts'

export type { AckStatus } from './ack-handler.ts'

/** A reservation an append makes for a partition here (reservationsFor), with the partition it is for. */
interface AppendClaim extends AppendReservation {
  g: GroupRuntime
  w: PartitionState
}
export type { Timers } from './schedule.ts'

export interface DispatcherDeps {
  db: Database
  /** Loads a group's row and consumers; null once deleted. */
  loadGroup(name: string): Promise<{ row: GroupRow; consumers: ConsumerRow[] } | null>
  /** Every group's row and consumers, in a few statements whatever their number (start-up and reconciliation). */
  loadGroups(): Promise<{ row: GroupRow; consumers: ConsumerRow[] }[]>
  /** Creates committed offsets (from startAt) for partitions that have none. */
  ensureOffsets(row: GroupRow, topic: TopicRow): Promise<void>
  /** Marks a consumer disabled (410 Gone). */
  disableConsumer(id: string, reason: string): Promise<void>
  attempts: AttemptLog
  agent: PushAgent
  log: { warn(obj: object, msg: string): void; error(obj: object, msg: string): void }
  metrics?: DispatchMetrics
  now?: () => number
  /** Timers for deadlines and retries (with `now`, a test's clock steps time instead of waiting). */
  timers?: Timers
  /** The per-consumer push window's bounds (see push-window.ts). */
  pushWindow?: PushWindowOptions
  /** A write for this partition was refused (its owner epoch moved on): it was dropped here. */
  onMoved?(groupName: string, partition: number): void
  /** The broker processes sharing the partitions, this one included: a progress writer is busy from a Nth of the jobs. */
  processes?: () => number
  /** Whether the CPU is busy (cpu-load.ts): a full progress writer waits for company only then; always when absent. */
  cpuBusy?: () => boolean
  /** How long the progress writer holds auto acks nothing waits on, for company (progress.ts lazyMs); not at all when absent. */
  lazyCompletionMs?: number
  /** Whether this process can still prove it owns its partitions, checked before each push (src/cluster/ownership.ts). */
  lease?: PushLease
}

/** What a read of every group found for one group: its row and consumers (null: deleted) and its topic (null: none). */
interface GroupRead {
  load: number
  loaded: { row: GroupRow; consumers: ConsumerRow[] } | null
  topic: TopicRow | null
}

export class Dispatcher implements AppendReserver<AppendClaim> {
  private readonly groups = new Map<string, GroupRuntime>()
  /** The same runtimes by group id: deadlines and the status view look groups up by id. */
  private readonly groupsById = new Map<number, GroupRuntime>()
  /** The same runtimes by topic id: an append wakes its topic's groups without a scan of all groups. */
  private readonly groupsByTopic = new Map<number, Set<GroupRuntime>>()
  /** Reloads of one group run one at a time (name → the last one queued). */
  private readonly reloads = new Map<string, Promise<void>>()
  /** The number (PendingDisables.beginLoad) of the read each group was last reloaded from. */
  private readonly appliedLoads = new Map<string, number>()
  /** The highest end offset produce has reported, per topic and partition, whether or not a group listens. */
  private readonly ends = new Map<number, Map<number, number>>()
  private readonly windows: ConsumerWindows
  private readonly schedule: Schedule
  private readonly progress: ProgressWriter
  private readonly reader: PartitionReader
  private readonly flow: PushFlow
  private readonly acks: AckHandler
  private readonly health: HealthRecorder
  private readonly disables = new PendingDisables()
  private readonly pulls: PullDesk
  /** Set by answerPulls: no pull waits any more. */
  private closingPulls = false
  private stopped = false

  constructor(private readonly deps: DispatcherDeps) {
    const now = deps.now ?? Date.now
    const timers = deps.timers ?? nodeTimers
    this.health = new HealthRecorder({ db: deps.db, now, timers, log: deps.log })
    this.windows = new ConsumerWindows({
      ...(deps.pushWindow ? { options: deps.pushWindow } : {}),
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
      now,
      timers,
      fill: (g, w) => this.flow.safely(() => this.flow.fill(g, w)),
    })
    this.schedule = new Schedule(now, timers, (entry) => this.flow.due(entry))
    this.progress = new ProgressWriter({
      db: deps.db,
      linger: DEFAULT_LINGER,
      ...(deps.processes ? { processes: deps.processes } : {}),
      ...(deps.cpuBusy ? { cpuBusy: deps.cpuBusy } : {}),
      ...(deps.lazyCompletionMs ? { lazyMs: deps.lazyCompletionMs } : {}),
      now,
      timers,
      onRefused: (g, w) => this.moved(g, w),
      onAppended: (topicId, partition, endOffset) => this.notifyAppend(topicId, partition, endOffset),
    })
    this.reader = new PartitionReader({
      db: deps.db,
      timers,
      log: deps.log,
      onReadable: (g, w) => this.flow.safely(() => this.flow.fill(g, w)),
    })
    this.pulls = new PullDesk({
      timers,
      busy: (groupId) => {
        for (const w of this.groupsById.get(groupId)?.parts.values() ?? []) if (w.reading || w.reserving || w.unsent.size > 0) return true
        return false
      },
    })
    this.flow = new PushFlow({
      pulls: this.pulls,
      db: deps.db,
      findTopic: (name) => findTopicByName(deps.db.prisma, name),
      attempts: deps.attempts,
      agent: deps.agent,
      log: deps.log,
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
      now,
      timers,
      schedule: this.schedule,
      windows: this.windows,
      progress: this.progress,
      reader: this.reader,
      group: (id) => this.groupsById.get(id),
      stopped: () => this.stopped,
      ...(deps.lease ? { lease: deps.lease } : {}),
      disableConsumer: (groupId, id, reason, at) => this.disables.disable(groupId, id, reason, at, () => deps.disableConsumer(id, reason)),
      moved: (g, w) => this.moved(g, w),
      health: this.health,
    })
    this.acks = new AckHandler({
      db: deps.db,
      attempts: deps.attempts,
      progress: this.progress,
      flow: this.flow,
      schedule: this.schedule,
      now,
    })
  }

  // ---- lifecycle ----

  /** Loads every group (their partitions come with acquire()). */
  async start(): Promise<void> {
    await this.reloadAll()
  }

  /**
   * Catches up with what notifications may not have told (another broker process's NOTIFY lost):
   * reloads every group, new and deleted ones included, and wakes partitions whose log grew. A few
   * statements for all groups, not a few per group: it runs every 5 s on every process.
   */
  async reconcile(): Promise<void> {
    await this.reloadAll()
    if (this.stopped) return
    for (const e of await readAllEndOffsets(this.deps.db.prisma)) {
      if (this.groupsByTopic.has(e.topicId)) this.notifyAppend(e.topicId, e.partition, e.endOffset)
    }
  }

  /** Every group read at once, and each applied as its own reload would (deleted ones dropped). */
  private async reloadAll(): Promise<void> {
    const load = this.disables.beginLoad()
    const [loaded, topics] = await Promise.all([this.deps.loadGroups(), listTopics(this.deps.db.prisma)])
    const topicsByName = new Map(topics.map((t) => [t.name, t]))
    const byName = new Map(loaded.map((l) => [l.row.name, l]))
    for (const name of new Set([...byName.keys(), ...this.groups.keys()])) {
      if (this.stopped) return
      const l = byName.get(name) ?? null
      await this.reload(name, { load, loaded: l, topic: l ? (topicsByName.get(l.row.topic) ?? null) : null })
    }
    // Deleted groups this read saw gone need no number kept.
    for (const [name, n] of this.appliedLoads) if (n <= load && !byName.has(name) && !this.groups.has(name)) this.appliedLoads.delete(name)
  }

  /**
   * The broker is shutting down: the callers waiting here are answered now with what they hold, and
   * later pulls at once, so the HTTP server's close does not wait out their long polls (a SIGTERM
   * that took waitMs, up to 20 s, could outlast a container's grace period).
   */
  answerPulls(): void {
    this.closingPulls = true
    this.pulls.closeAll()
  }

  /** Stops pushing; waits for queued completions to be written. In-flight pushes are abandoned (they will be redelivered). */
  async stop(): Promise<void> {
    this.stopped = true
    this.schedule.stop()
    this.pulls.closeAll()
    await this.progress.drain()
    // Before the session ends and the others take the partitions: what was not pushed is given back.
    await this.dropAll('abandoned: the broker process stopped')
    await this.health.close()
  }

  // ---- groups ----

  /**
   * Re-reads a group (created, updated, deleted, consumers changed) and adjusts what it pushes;
   * `read` is what a read of every group found for it (reloadAll), when that is newer than what was applied.
   */
  reload(name: string, read?: GroupRead): Promise<void> {
    // One at a time per group: two overlapping reloads could build two runtimes, or apply an
    // older consumer list after a newer one.
    const previous = this.reloads.get(name) ?? Promise.resolve()
    const next = previous.then(
      () => this.reloadNow(name, read),
      () => this.reloadNow(name, read),
    )
    this.reloads.set(name, next)
    const forget = () => {
      if (this.reloads.get(name) === next) this.reloads.delete(name)
    }
    next.then(forget, forget)
    return next
  }

  private async reloadNow(name: string, read?: GroupRead): Promise<void> {
    if (this.stopped) return
    // A read of the group alone that began after the read of all groups was applied first: keep it.
    if (read && (this.appliedLoads.get(name) ?? 0) > read.load) return
    const load = read?.load ?? this.disables.beginLoad()
    const loaded = read ? read.loaded : await this.deps.loadGroup(name)
    if (loaded) this.disables.apply(loaded.row.id, load, loaded.consumers)
    const current = this.groups.get(name)
    const topic = read ? read.topic : loaded ? await findTopicByName(this.deps.db.prisma, loaded.row.topic) : null
    this.appliedLoads.set(name, Math.max(load, this.appliedLoads.get(name) ?? 0))
    if (!loaded || !topic || (current && current.topic.id !== topic.id)) {
      if (current) this.drop(current)
      if (!loaded || !topic) return
    }
    const existing = this.groups.get(name)
    if (existing) {
      const filterChanged = existing.row.filter !== loaded.row.filter
      const previousOrdering = existing.row.ordering
      const previousDelivery = existing.row.delivery
      existing.row = loaded.row
      // Switched to push: its waiting callers are answered now (the service says 409 push_group), not at waitMs.
      if (previousDelivery !== loaded.row.delivery) this.pulls.closeGroup(existing.row.id)
      existing.policy = policyOf(loaded.row)
      if (filterChanged) this.flow.filterChanged(existing, filterOf(loaded.row))
      if (previousOrdering !== loaded.row.ordering) this.flow.orderingChanged(existing, previousOrdering)
      this.flow.consumersChanged(existing, loaded.consumers)
      return
    }
    // Committed offsets exist before any process claims a partition (the claim bumps their epoch).
    await this.deps.ensureOffsets(loaded.row, topic)
    if (this.stopped || this.groups.has(name)) return
    const g = newGroupRuntime(loaded.row, topic)
    this.groups.set(name, g)
    this.groupsById.set(g.row.id, g)
    let ofTopic = this.groupsByTopic.get(g.topic.id)
    if (!ofTopic) this.groupsByTopic.set(g.topic.id, (ofTopic = new Set()))
    ofTopic.add(g)
    this.flow.consumersChanged(g, loaded.consumers)
  }

  /** A topic was deleted: forget its groups' runtimes (their rows stay; they resume if it is recreated). */
  topicDeleted(topicId: number): void {
    this.ends.delete(topicId)
    for (const g of [...(this.groupsByTopic.get(topicId) ?? [])]) this.drop(g)
  }

  private drop(g: GroupRuntime): void {
    g.dropped = true
    // Deleted, or its topic gone: callers waiting for it are answered now (a deleted group's with 404 by the service).
    this.pulls.closeGroup(g.row.id)
    for (const c of g.consumers) this.windows.forget(c.id)
    for (const w of [...g.parts.values()]) this.dropPartition(g, w, 'abandoned: the group or its topic changed')
    this.groups.delete(g.row.name)
    if (this.groupsById.get(g.row.id) === g) this.groupsById.delete(g.row.id)
    const ofTopic = this.groupsByTopic.get(g.topic.id)
    ofTopic?.delete(g)
    if (ofTopic?.size === 0) this.groupsByTopic.delete(g.topic.id)
  }

  // ---- partitions ----

  /** Whether this process pushes the partition (owns it, and is not handing it over). */
  owns(groupId: number, partition: number): boolean {
    const w = this.groupsById.get(groupId)?.parts.get(partition)
    return w !== undefined && !w.releasing
  }

  /**
   * Starts pushing a partition this process has just claimed (`ownerEpoch`, see
   * src/store/membership.ts claimPartition): rebuilds its progress from PostgreSQL as a restart
   * does. False when the group is not (or no longer) running here.
   */
  async acquire(name: string, partition: number, ownerEpoch: number): Promise<boolean> {
    const g = this.groups.get(name)
    if (!g || g.dropped || partition >= g.topic.partitions || this.stopped) return false
    const old = g.parts.get(partition)
    if (old) this.dropPartition(g, old, 'abandoned: the partition was claimed again')
    const { db } = this.deps
    const pr = (await loadProgress(db.pool, g.row.id, g.topic.id, partition)) ?? {
      committed: 0,
      completed: new Set<number>(),
      pushed: 0,
      seekedAtMs: 0,
    }
    // Attempts its previous owner left in flight ended with that ownership and their messages go
    // again, but for those it handed over (a graceful move): each is this process's attempt in flight
    // now, until its ack deadline, and the consumer may ack, nack or extend it meanwhile. (One that
    // is not its message's last counted attempt, or of a message completed since, ends like the others.)
    const handedOver = await handedOverInFlight(db.pool, g.row.id, partition, pr.committed, pr.seekedAtMs)
    const reservedOnly = new Set<number>()
    const priorAttempts = await attemptCounts(db.pool, g.row.id, g.topic.id, partition, pr, reservedOnly)
    const keep: string[] = []
    for (const [offset, h] of handedOver) {
      if (pr.completed.has(offset)) handedOver.delete(offset)
      else if (h.inFlight && priorAttempts.get(offset) === h.inFlight.attempt) keep.push(h.inFlight.id)
      else if (h.inFlight) h.inFlight = undefined
    }
    await abandonInFlight(db.pool, g.row.id, partition, keep)
    const end = (await readEndOffsets(this.deps.db.prisma, g.topic.id)).find((e) => e.partition === partition)?.endOffset ?? 0
    if (this.stopped || g.dropped || this.groups.get(name) !== g || g.parts.has(partition)) return false
    // Appends notified while this was loading were missed by notifyAppend: the per-topic record has them.
    const endHint = Math.max(end, this.ends.get(g.topic.id)?.get(partition) ?? 0)
    const w = newPartitionState(partition, pr, priorAttempts, endHint, ownerEpoch, handedOver, reservedOnly)
    g.parts.set(partition, w)
    this.flow.limitConsumers(g)
    this.flow.fill(g, w)
    return true
  }

  /**
   * Stops pushing a partition. `graceful` (handing it to another process): nothing new goes out,
   * the pushes under way are answered (at most the push timeout) and the completions written, so
   * the next owner finds everything acked on record and an ordered partition never has two
   * messages out. Otherwise (the session is lost, so the lock is gone already) at once.
   */
  async release(name: string, partition: number, graceful: boolean): Promise<void> {
    const g = this.groups.get(name)
    const w = g?.parts.get(partition)
    if (!g || !w) return
    if (graceful && !w.dropped) {
      let idle = () => {}
      const answered = new Promise<void>((resolve) => (idle = resolve))
      if (w.release(() => idle())) {
        const timer = setTimeout(idle, timerDelayMs(g.row.pushTimeoutMs + 1000))
        await answered
        clearTimeout(timer)
      }
      // (Releasing, it takes no new ones.)
      await w.appendsReserved()
      await this.progress.settled()
    }
    // Given back however it goes: the write is fenced, so it lands only if nobody claimed the partition since.
    const back = !w.dropped ? handBackOf(g, w) : undefined
    const handed = back && graceful ? awaitingAcks(g, w) : undefined
    if (g.parts.get(partition) === w) this.dropPartition(g, w, 'abandoned: the partition moved to another broker process', handed)
    // Dropped at once, but an append that claimed first pushes here before the drop reserves them
    // when it commits: the give-back, to an offset at or below theirs, waits for it (graceful: above).
    if (!graceful) await w.appendsReserved()
    // Handing over: the attempt rows of its pushes are written before the next owner can take it,
    // so an ack that follows the partition there finds its attempt (a row still in memory here
    // would make the new owner answer `unknown` for a delivery id it cannot check), and it counts
    // exactly the pushes made here.
    if (graceful || back) await this.handBack(back ? [back] : [], (handed?.size ?? 0) > 0)
  }

  /**
   * Writes the attempt log, then tells the database which reserved first pushes and recorded
   * retries of these (dropped) partitions never went out, for those whose rows are all written:
   * the next owner then continues each message at the attempt after the last one pushed.
   */
  private async handBack(backs: HandBack[], all = false): Promise<void> {
    try {
      // `all`: rows of attempts handed over in flight are written now, for the next owner to read.
      await this.deps.attempts.flush(all)
      const written = backs.filter((b) => !this.deps.attempts.unwritten(b.groupId, b.partition))
      await handBack(this.deps.db.pool, written)
    } catch (err) {
      // The reservation stays: the next owner may count a push never made (a skipped attempt number), never miss one.
      this.deps.log.warn({ err }, 'writing the attempt log or giving back unpushed reservations before a handover failed')
    }
  }

  /** The backoff after a failed `attempt` of a group loaded here (undefined: not loaded). */
  retryDelayMs(name: string, attempt: number): number | undefined {
    const g = this.groups.get(name)
    return g ? nextDelayMs(attempt, g.policy) : undefined
  }

  /** Drops every partition at once (the session that owned them is gone). */
  releaseAll(): void {
    void this.dropAll('abandoned: this process lost its partitions')
  }

  /**
   * Drops every partition at once, then gives back what they never pushed. The give-back waits for
   * the appends under way on them: one that claimed first pushes before the drop (Partition
   * appendClaims) reserves them when it commits, and a give-back landed before that commit would
   * leave them reserved, never pushed, so the next owner would count an attempt never made. What
   * is given back is read before the drop, and is at or below every such append's messages.
   */
  private async dropAll(why: string): Promise<void> {
    const backs: HandBack[] = []
    const appending: Promise<void>[] = []
    for (const g of this.groups.values()) {
      for (const w of [...g.parts.values()]) {
        backs.push(handBackOf(g, w))
        appending.push(w.appendsReserved())
        this.dropPartition(g, w, why, awaitingAcks(g, w))
      }
    }
    await Promise.all(appending)
    // Fenced: lands for the partitions nobody has claimed since (then the next owner counts exactly what was pushed here).
    await this.handBack(backs, true)
  }

  /** The owner epochs this process holds, to compare with the database's now and then. */
  heldEpochs(): { name: string; key: PartitionKey; ownerEpoch: number }[] {
    const out: { name: string; key: PartitionKey; ownerEpoch: number }[] = []
    for (const g of this.groups.values()) {
      for (const w of g.parts.values())
        out.push({ name: g.row.name, key: { groupId: g.row.id, topicId: g.topic.id, partition: w.partition }, ownerEpoch: w.ownerEpoch })
    }
    return out
  }

  /** `handed`: messages whose current attempt stays in flight for the next owner (see HANDED_OVER). */
  private dropPartition(g: GroupRuntime, w: PartitionState, reason: string, handed?: Set<Outstanding>): void {
    for (const o of w.drop()) {
      // Begun but never sent (Partition.unsent): not an attempt. Its row is not written now, or,
      // written already, deleted by the handover (handBackOf named it), and it ends nothing.
      const unsent = o.current !== undefined && !o.current.sent ? o.current : undefined
      if (unsent) {
        w.close(unsent)
        this.deps.attempts.forget(unsent.id)
      }
      // Handed over in flight: its row stays open for the next owner (see HANDED_OVER).
      const handedOver = handed?.has(o) ? o.current : undefined
      if (handedOver) w.close(handedOver)
      this.flow.abandon(w, o, reason)
      if (handedOver) this.deps.attempts.update({ id: handedOver.id, error: HANDED_OVER })
    }
    if (g.parts.get(w.partition) === w) {
      g.parts.delete(w.partition)
      if (!g.dropped) this.flow.limitConsumers(g)
    }
  }

  /** A write for the partition was refused for its epoch: another process (or a seek) has it now. */
  private moved(g: GroupRuntime, w: PartitionState): void {
    if (w.dropped) return
    this.deps.log.warn(
      { group: g.row.name, partition: w.partition },
      'the partition moved on (its owner epoch changed): it is dropped here',
    )
    this.dropPartition(g, w, 'abandoned: the partition moved to another broker process')
    this.deps.onMoved?.(g.row.name, w.partition)
  }

  /**
   * Produce appended to a topic: wake its groups' partitions. With the appended `messages` (in
   * offset order, from this process's own produce), a partition whose next offset to take is the
   * first of them takes them straight into its buffer instead of reading them back from the log.
   */
  notifyAppend(topicId: number, partition: number, endOffset: number, messages?: DispatchMessage[]): void {
    let topicEnds = this.ends.get(topicId)
    if (!topicEnds) this.ends.set(topicId, (topicEnds = new Map()))
    if (endOffset > (topicEnds.get(partition) ?? -1)) topicEnds.set(partition, endOffset)
    for (const g of this.groupsByTopic.get(topicId) ?? []) {
      const w = g.parts.get(partition)
      if (!w) continue
      if (messages && messages.length > 0) this.reader.takeTail(g, w, messages)
      w.heard(endOffset)
      this.flow.fill(g, w)
    }
  }

  /**
   * The first pushes an append of `entries` may reserve in its own statement, for the partitions
   * this process owns (Reservations.appendRoom says which): the leading messages of each partition,
   * up to its first delayed one. Their room is held until appendReservationsDone.
   */
  reservationsFor(entries: readonly AppendEntry[]): AppendClaim[] {
    const claims: AppendClaim[] = []
    if (this.stopped) return claims
    // Per partition appended to: the partitions here idle enough to take its messages at once
    // (null: none, its entries skipped), and the keys of its leading undelayed messages.
    const leads = new Map<number, { here: [GroupRuntime, PartitionState][]; keys: (string | null)[]; closed: boolean } | null>()
    for (const e of entries) {
      const at = partitionKey(e.topicId, e.partition)
      let lead = leads.get(at)
      if (lead === null) continue
      if (lead === undefined) {
        const here: [GroupRuntime, PartitionState][] = []
        for (const g of this.groupsByTopic.get(e.topicId) ?? []) {
          const w = g.parts.get(e.partition)
          if (w && this.flow.reservations.appendIdle(g, w)) here.push([g, w])
        }
        leads.set(at, (lead = here.length > 0 ? { here, keys: [], closed: false } : null))
        if (lead === null) continue
      }
      if (lead.closed) continue
      if (e.delayMs > 0) lead.closed = true
      else lead.keys.push(e.key)
    }
    for (const lead of leads.values()) {
      if (!lead || lead.keys.length === 0) continue
      for (const [g, w] of lead.here) {
        const count = this.flow.reservations.appendRoom(g, w, lead.keys)
        if (count <= 0) continue
        w.beginAppendReservation(count)
        claims.push({ groupId: g.row.id, topicId: g.topic.id, partition: w.partition, ownerEpoch: w.ownerEpoch, count, g, w })
      }
    }
    return claims
  }

  /** The append is done: each claim's reservation now ends at reservedTo (null: not written). */
  reservationsDone(claims: AppendClaim[], reservedTo: readonly (number | null)[]): void {
    claims.forEach((c, i) => {
      this.flow.safely(() => this.flow.reservations.appendReserved(c.g, c.w, c.count, reservedTo[i] ?? null))
    })
  }

  // ---- calls from the services ----

  /** True when the group is running here (it exists, and so does its topic). */
  hasGroup(name: string): boolean {
    return this.groups.has(name)
  }

  /** The partition count of a group running here (its topic's), undefined when it is not. */
  partitionCount(name: string): number | undefined {
    return this.groups.get(name)?.topic.partitions
  }

  /** Messages outstanding on a partition (for the group status). */
  inFlight(groupId: number, partition: number): number {
    return this.groupsById.get(groupId)?.parts.get(partition)?.outstanding.size ?? 0
  }

  /** Callers of pull waiting here for the group (the status view, tests). */
  pullWaiters(name: string): number {
    const g = this.groups.get(name)
    return g ? this.pulls.waiters(g.row.id) : 0
  }

  /** The group's delivery ('push' or 'pull'), undefined when it is not running here. */
  deliveryOf(name: string): 'push' | 'pull' | undefined {
    return this.groups.get(name)?.row.delivery
  }

  /**
   * Leases up to maxMessages of a pull group's messages on the partitions owned here, waiting up
   * to waitMs for the first (pull-desk.ts): their envelopes. `signal`: the caller went away.
   */
  pull(name: string, opts: { maxMessages: number; waitMs: number; leaseMs: number | undefined }, signal?: AbortSignal): Promise<string[]> {
    const g = this.groups.get(name)
    if (!g || this.stopped || this.closingPulls || signal?.aborted) return Promise.resolve([])
    return new Promise((resolve) => {
      const t = new Taker(g.row.id, opts.maxMessages, opts.leaseMs ?? g.row.ackTimeoutMs, opts.waitMs === 0, resolve)
      this.pulls.add(t, opts.waitMs)
      signal?.addEventListener('abort', () => this.pulls.gone(t), { once: true })
      this.flow.safely(() => this.flow.pullerCame(g))
      this.pulls.settled(g.row.id)
    })
  }

  /**
   * Waits up to waitMs until a message of the pull group could be leased on the partitions owned
   * here, leasing none (pull-desk.ts, probes): true if one could. A gather over several processes
   * asks this first, then leases only what its caller takes.
   */
  probe(name: string, waitMs: number, signal?: AbortSignal): Promise<boolean> {
    const g = this.groups.get(name)
    if (!g || this.stopped || this.closingPulls || signal?.aborted || waitMs <= 0) return Promise.resolve(false)
    return new Promise((resolve) => {
      const t: Taker = new Taker(g.row.id, 0, g.row.ackTimeoutMs, false, () => resolve(t.ready), true)
      this.pulls.add(t, waitMs)
      signal?.addEventListener('abort', () => this.pulls.gone(t), { once: true })
      this.flow.safely(() => this.flow.pullerCame(g))
    })
  }

  /**
   * Leases of a pull whose caller went away before they reached it (their delivery ids): each
   * still current is leasable again at once (PushFlow.unlease). Ids of partitions not owned here are skipped.
   */
  giveBack(name: string, deliveryIds: string[]): void {
    const g = this.groups.get(name)
    if (!g) return
    for (const id of deliveryIds) {
      const key = parseDeliveryId(id)
      const w = key && key.groupId === g.row.id ? g.parts.get(key.partition) : undefined
      const o = w?.outstanding.get(key!.offset)
      const a = o?.current
      if (!w || !o || !a || a.id !== id || o.state !== 'in_flight') continue
      this.flow.safely(() => this.flow.unlease(g, w, o, a))
    }
  }

  /** Acks: completes each message; durable when this resolves. */
  ack(groupName: string, deliveryIds: string[]): Promise<AckResult[]> {
    return this.acks.ack(this.groups.get(groupName), deliveryIds)
  }

  /** Nacks: a failed attempt; pushed again after `delayMs` (else the backoff), or dead-lettered at once. */
  nack(groupName: string, deliveryIds: string[], delayMs: number | undefined, deadLetter: boolean): Promise<AckResult[]> {
    return this.acks.nack(this.groups.get(groupName), deliveryIds, delayMs, deadLetter)
  }

  /** Extends ack deadlines to now + extendMs. */
  extend(groupName: string, deliveryIds: string[], extendMs: number): Promise<AckResult[]> {
    return this.acks.extend(this.groups.get(groupName), deliveryIds, extendMs)
  }

  /** Each consumer's push window, for the metrics. */
  pushWindows(): PushWindowStat[] {
    return this.windows.stats()
  }
}

/** What a partition handed over gives back (src/store/consumption.ts handBack), read before it is dropped. */
function handBackOf(g: GroupRuntime, w: PartitionState): HandBack {
  return {
    groupId: g.row.id,
    topicId: g.topic.id,
    partition: w.partition,
    ownerEpoch: w.ownerEpoch,
    unpushedFrom: w.firstUnpushed(),
    unsent: [...w.unsent],
  }
}

/** Explicit-ack messages whose current push was answered and whose ack may still come: handed over in flight. */
function awaitingAcks(g: GroupRuntime, w: PartitionState): Set<Outstanding> {
  const out = new Set<Outstanding>()
  if (g.row.ackMode !== 'explicit' && g.row.delivery !== 'pull') return out
  for (const o of w.outstanding.values())
    if (o.state === 'in_flight' && o.current !== undefined && o.current.sent && !o.current.pushing) out.add(o)
  return out
}

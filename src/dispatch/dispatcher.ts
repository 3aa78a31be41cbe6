/**
 * The dispatcher: reads each (group, partition) in offset order from its committed offset, pushes
 * messages to the partition's consumer, and settles every attempt.
 *
 * Invariant: every push attempt ends in exactly one outcome — acked, failed, timed_out, nacked or
 * dead — and writes exactly one attempt row (inserted in_flight when the push starts, updated once
 * its outcome is known).
 *
 * A message of a partition, once read, is "outstanding" until completed (acked or dead):
 *
 *   delayed ──due──▶ pushing/in_flight ──2xx (auto) / ack──▶ completing ──commit──▶ gone
 *                        │   ▲                                   │
 *     fail / deadline / nack  └──────── retry_wait ◀──────────────┘ (commit failed)
 *                        └── attempts = maxDeliveries ──▶ completing (dead letter)
 *   parked: due, but the partition has no consumer or the group is paused; pushed when that ends.
 *   ready: due, but the partition had maxInFlight messages active or the consumer's push window
 *          was full; pushed first when there is room.
 *
 * At most `maxInFlight` messages of a partition are active (pushed, waiting for an ack or a retry;
 * when `ordered`, at most 1 outstanding of any state, which keeps strict per-partition order through
 * failures and delays). Messages still waiting for their `delayMs` do not count against maxInFlight
 * in unordered groups (up to MAX_DELAYED of them are held), so they hold nothing back. Deadlines
 * (acks, retries, delays) live in one InFlightTracker with one timer for the earliest. Completions
 * are written in batches by a GroupCommitter. Pushes to one consumer are limited by its PushWindow
 * (slow start: it grows while the consumer keeps up and halves when it struggles). PostgreSQL
 * holds the truth, so a restart rebuilds all of this from committed offsets, completions and the
 * attempt log.
 *
 * Every broker process on a database runs one dispatcher, and it pushes only the partitions its
 * process owns (src/cluster/ownership.ts): a group is loaded here in full (row, consumers), a
 * partition only when acquire() is called for it, with the owner epoch that fences its writes. A
 * write the database refuses for a stale epoch drops the partition here at once (onMoved).
 */
import { HookqError } from '../errors.ts'
import type { Database } from '../store/db.ts'
import type { ConsumerRow, GroupRow } from '../store/groups.ts'
import type { TopicRow, TopicStore } from '../store/topics.ts'
import { assignPartitions } from '../service/groups.ts'
import { attemptCounts, loadProgress, readForDispatch, type DispatchMessage, type PartitionKey } from '../store/consumption.ts'
import { abandonInFlight, findAttempt } from '../store/deliveries.ts'
import { newDeliveryId, parseDeliveryId } from '../store/delivery-id.ts'
import type { DispatchMetrics, PushWindowStat } from '../metrics.ts'
import type { AttemptLog } from './attempt-log.ts'
import { buildPush, signingSecrets } from './envelope.ts'
import { send as sendPush, type PushAgent, type PushResult } from './pusher.ts'
import { pushSignal, type PushWindowOptions } from './push-window.ts'
import { ConsumerWindows } from './consumer-windows.ts'
import { DeliveryIndex } from './delivery-index.ts'
import { ProgressWriter } from './progress.ts'
import { honourRetryAfterMs, nextDelayMs } from './retry-policy.ts'
import { InFlightTracker, TrackerEntry } from './tracker.ts'
import { active, deadLetterEntry, nextIncomplete, policyOf, type CompletionRequest, type CompletionStatus, type GroupRuntime, type Outstanding, type PartitionState, type State } from './partition-state.ts'

export type AckStatus = 'acked' | 'nacked' | 'extended' | 'already_completed' | 'unknown'

export interface DispatcherDeps {
  db: Database
  topics: TopicStore
  /** Loads a group's row and consumers; null once deleted. */
  loadGroup(name: string): Promise<{ row: GroupRow; consumers: ConsumerRow[] } | null>
  listGroups(): Promise<GroupRow[]>
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
}

/** What the dispatcher needs of timers: node's by default. */
export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown
  clearTimeout(handle: unknown): void
}
const nodeTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms).unref(),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
}

const READ_BATCH = 200
/** Messages a partition's buffer takes from produce directly (see takeTail). */
const MAX_TAIL = 2000
/** Completed delivery ids remembered for duplicate acks (~100 bytes each). */
const RECENT_IDS = 100_000
/** Delayed messages held per partition at most (beyond maxInFlight); later ones wait in the log. */
const MAX_DELAYED = 1000

export class Dispatcher {
  private readonly tracker = new InFlightTracker()
  private readonly groups = new Map<string, GroupRuntime>()
  /** The same runtimes by group id: timer entries and the status view look groups up by id. */
  private readonly groupsById = new Map<number, GroupRuntime>()
  /** Delivery ids issued here → their messages, and those of recently completed messages. */
  private readonly deliveries = new DeliveryIndex(RECENT_IDS)
  /** Completions and push reservations of every partition, written together (see progress.ts). */
  private readonly progress: ProgressWriter
  /** Reloads of one group run one at a time (name → the last one queued). */
  private readonly reloads = new Map<string, Promise<void>>()
  /** The highest end offset produce has reported, per topic and partition, whether or not a group listens. */
  private readonly ends = new Map<number, Map<number, number>>()
  /** Each consumer's push window. */
  private readonly windows: ConsumerWindows
  private timer: unknown
  private timerAtMs = Infinity
  private waitSeq = 0
  private stopped = false
  private readonly now: () => number
  private readonly timers: Timers

  constructor(private readonly deps: DispatcherDeps) {
    this.now = deps.now ?? Date.now
    this.timers = deps.timers ?? nodeTimers
    this.windows = new ConsumerWindows(deps.pushWindow)
    this.progress = new ProgressWriter({
      db: deps.db,
      onRefused: (g, w) => this.moved(g, w),
      onAppended: (topicId, partition, endOffset) => this.notifyAppend(topicId, partition, endOffset),
    })
  }

  /** Loads every group (their partitions come with acquire()). */
  async start(): Promise<void> {
    for (const row of await this.deps.listGroups()) {
      if (this.stopped) return
      await this.reload(row.name)
    }
  }

  /**
   * Catches up with what notifications may not have told (another broker process's NOTIFY lost):
   * reloads every group, new and deleted ones included, and wakes partitions whose log grew.
   */
  async reconcile(): Promise<void> {
    const names = new Set((await this.deps.listGroups()).map((r) => r.name))
    for (const name of this.groups.keys()) names.add(name)
    for (const name of names) {
      if (this.stopped) return
      await this.reload(name)
    }
    const topicIds = new Set([...this.groups.values()].map((g) => g.topic.id))
    for (const topicId of topicIds) {
      if (this.stopped) return
      for (const e of await this.deps.topics.endOffsets(topicId)) this.notifyAppend(topicId, e.partition, e.endOffset)
    }
  }

  /** Stops pushing; waits for queued completions to be written. In-flight pushes are abandoned (they will be redelivered). */
  async stop(): Promise<void> {
    this.stopped = true
    this.timers.clearTimeout(this.timer)
    await this.progress.drain()
  }

  /** Re-reads a group (created, updated, deleted, consumers changed) and adjusts what it pushes. */
  reload(name: string): Promise<void> {
    // One at a time per group: two overlapping reloads could build two runtimes, or apply an
    // older consumer list after a newer one.
    const previous = this.reloads.get(name) ?? Promise.resolve()
    const next = previous.then(() => this.reloadNow(name), () => this.reloadNow(name))
    this.reloads.set(name, next)
    const forget = () => { if (this.reloads.get(name) === next) this.reloads.delete(name) }
    next.then(forget, forget)
    return next
  }

  private async reloadNow(name: string): Promise<void> {
    if (this.stopped) return
    const loaded = await this.deps.loadGroup(name)
    const current = this.groups.get(name)
    const topic = loaded ? await this.deps.topics.findByName(loaded.row.topic) : null
    if (!loaded || !topic || (current && current.topic.id !== topic.id)) {
      if (current) this.drop(current)
      if (!loaded || !topic) return
    }
    const existing = this.groups.get(name)
    if (existing) {
      existing.row = loaded.row
      existing.policy = policyOf(loaded.row)
      this.setConsumers(existing, loaded.consumers)
      return
    }
    // Committed offsets exist before any process claims a partition (the claim bumps their epoch).
    await this.deps.ensureOffsets(loaded.row, topic)
    if (this.stopped || this.groups.has(name)) return
    const g: GroupRuntime = { row: loaded.row, topic, consumers: [], owners: [], parts: new Map(), policy: policyOf(loaded.row), dropped: false }
    this.groups.set(name, g)
    this.groupsById.set(g.row.id, g)
    this.setConsumers(g, loaded.consumers)
  }

  /** Whether this process pushes the partition (owns it, and is not handing it over). */
  owns(groupId: number, partition: number): boolean {
    const w = this.groupsById.get(groupId)?.parts.get(partition)
    return w !== undefined && !w.releasing
  }

  /** The id of a group running here, if it is. */
  groupId(name: string): number | undefined {
    return this.groups.get(name)?.row.id
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
    // Attempts its previous owner left in flight ended with that ownership; their messages go again.
    await abandonInFlight(db, g.row.id, partition)
    const pr = (await loadProgress(db, g.row.id, g.topic.id, partition)) ?? { committed: 0, completed: new Set<number>(), pushed: 0, seekedAtMs: 0 }
    const priorAttempts = await attemptCounts(db, g.row.id, g.topic.id, partition, pr)
    const end = (await this.deps.topics.endOffsets(g.topic.id)).find((e) => e.partition === partition)?.endOffset ?? 0
    if (this.stopped || g.dropped || this.groups.get(name) !== g || g.parts.has(partition)) return false
    const w: PartitionState = {
      partition, committed: pr.committed, completed: pr.completed, readPos: pr.committed,
      // Appends notified while this was loading were missed by notifyAppend: the per-topic record has them.
      endHint: Math.max(end, this.ends.get(g.topic.id)?.get(partition) ?? 0), buffer: [], reading: false,
      outstanding: new Map(), priorAttempts, reservedTo: pr.pushed, reserving: false,
      seekAtMs: pr.seekedAtMs, epoch: 0, delayed: 0, ready: [], gaps: [], ownerEpoch, releasing: false, onIdle: undefined, dropped: false,
    }
    g.parts.set(partition, w)
    this.fill(g, w)
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
      w.releasing = true
      if ([...w.outstanding.values()].some((o) => o.pushing)) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, g.row.pushTimeoutMs + 1000)
          w.onIdle = () => { clearTimeout(timer); resolve() }
        })
      }
      await this.progress.settled()
    }
    if (g.parts.get(partition) === w) this.dropPartition(g, w, 'abandoned: the partition moved to another broker process')
  }

  /** Drops every partition at once (the session that owned them is gone). */
  releaseAll(): void {
    for (const g of this.groups.values()) for (const w of [...g.parts.values()]) this.dropPartition(g, w, 'abandoned: this process lost its partitions')
  }

  /** The owner epochs this process holds, to compare with the database's now and then. */
  heldEpochs(): { name: string; key: PartitionKey; ownerEpoch: number }[] {
    const out: { name: string; key: PartitionKey; ownerEpoch: number }[] = []
    for (const g of this.groups.values()) {
      for (const w of g.parts.values()) out.push({ name: g.row.name, key: { groupId: g.row.id, topicId: g.topic.id, partition: w.partition }, ownerEpoch: w.ownerEpoch })
    }
    return out
  }

  private dropPartition(g: GroupRuntime, w: PartitionState, reason: string): void {
    w.dropped = true
    for (const o of w.outstanding.values()) this.abandon(o, reason)
    w.outstanding.clear()
    w.ready = []
    w.buffer = []
    if (g.parts.get(w.partition) === w) g.parts.delete(w.partition)
    w.onIdle?.()
    this.armTimer()
  }

  /** A write for the partition was refused for its epoch: another process (or a seek) has it now. */
  private moved(g: GroupRuntime, w: PartitionState): void {
    if (w.dropped) return
    this.deps.log.warn({ group: g.row.name, partition: w.partition }, 'the partition moved on (its owner epoch changed): it is dropped here')
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
    for (const g of this.groups.values()) {
      if (g.topic.id !== topicId) continue
      const w = g.parts.get(partition)
      if (!w) continue
      if (messages && messages.length > 0) this.takeTail(g, w, messages)
      if (endOffset > w.endHint) w.endHint = endOffset
      this.fill(g, w)
    }
  }

  /**
   * Appends freshly produced messages to the partition's buffer when they follow on from it
   * exactly. Otherwise (a read under way, or messages before them not read yet) the log has them
   * and they are read as usual. Only while the partition is pushing, and bounded by what its
   * window can take soon (as much again as maxInFlight, at least a read batch), so messages held
   * here stay of the order of those in flight; a partition that is not keeping up reads instead.
   */
  private takeTail(g: GroupRuntime, w: PartitionState, messages: DispatchMessage[]): void {
    if (w.reading || w.dropped || w.releasing || g.row.paused || !g.owners[w.partition]) return
    const room = Math.min(MAX_TAIL, Math.max(READ_BATCH, 2 * g.row.maxInFlight))
    if (w.buffer.length + messages.length > room) return
    const next = w.buffer.length > 0 ? w.buffer[w.buffer.length - 1]!.offset + 1 : w.readPos
    if (messages[0]!.offset !== next || next < w.endHint) return
    for (const m of messages) w.buffer.push(m)
  }

  /** A topic was deleted: forget its groups' runtimes (their rows stay; they resume if it is recreated). */
  topicDeleted(topicId: number): void {
    this.ends.delete(topicId)
    for (const g of [...this.groups.values()]) if (g.topic.id === topicId) this.drop(g)
  }

  /** already_completed for an id of a message this group completed recently, else unknown. */
  private recentStatus(g: GroupRuntime | undefined, id: string): AckStatus {
    return this.deliveries.completedRecently(g, id) ? 'already_completed' : 'unknown'
  }

  /** Forgets an outstanding message (seek, group change): its open attempts end as failed. */
  private abandon(o: Outstanding, reason: string): void {
    this.cancel(o)
    this.deliveries.abandon(o.ids)
    const finishedAt = new Date(this.now())
    for (const id of o.open) this.deps.attempts.update({ id, outcome: 'failed', finishedAt, error: reason })
    o.open.clear()
  }

  /** True when the group is running here (it exists, and so does its topic). */
  hasGroup(name: string): boolean {
    return this.groups.has(name)
  }

  /** Messages outstanding on a partition (for the group status). */
  inFlight(groupId: number, partition: number): number {
    return this.groupsById.get(groupId)?.parts.get(partition)?.outstanding.size ?? 0
  }

  /** Acks: completes each message; durable when this resolves. */
  async ack(groupName: string, deliveryIds: string[]): Promise<{ deliveryId: string; status: AckStatus }[]> {
    const g = this.groups.get(groupName)
    const out: { deliveryId: string; status: AckStatus }[] = deliveryIds.map((deliveryId) => ({ deliveryId, status: 'unknown' as AckStatus }))
    if (!g) return out
    const reqs: { i: number; req: CompletionRequest }[] = []
    let moved = false
    for (const [i, id] of deliveryIds.entries()) {
      const loc = await this.locate(g, id)
      if (loc === 'moved') { moved = true; continue }
      if (!loc) {
        out[i]!.status = this.recentStatus(g, id)
        continue
      }
      const { w, offset } = loc
      const o = w.outstanding.get(offset)
      if (o && o.state !== 'completing') this.cancel(o)
      if (o) this.setState(w, o, 'completing')
      reqs.push({ i, req: { g, w, epoch: w.epoch, offset, outcome: 'acked' } })
    }
    let statuses: CompletionStatus[]
    try {
      statuses = await this.completeAll(reqs.map((r) => r.req))
    } catch (err) {
      for (const { req } of reqs) this.completionFailed(req)
      throw err
    }
    for (const [k, { i, req }] of reqs.entries()) {
      const status = statuses[k]!
      if (status === 'moved') { moved = true; continue }
      out[i]!.status = status === 'dead' ? 'acked' : status
      this.completed(req, deliveryIds[i]!, status === 'acked' ? 'acked' : undefined)
    }
    // The others are durable; the caller asks again, and the partition's new owner answers for these.
    if (moved) throw movedError()
    return out
  }

  /** Nacks: a failed attempt; pushed again after `delayMs` (else the backoff), or dead-lettered at once. */
  async nack(groupName: string, deliveryIds: string[], delayMs: number | undefined, deadLetter: boolean): Promise<{ deliveryId: string; status: AckStatus }[]> {
    const g = this.groups.get(groupName)
    const out: { deliveryId: string; status: AckStatus }[] = []
    let moved = false
    for (const id of deliveryIds) {
      const loc = g ? await this.locate(g, id) : null
      if (loc === 'moved') { moved = true; continue }
      if (!g || !loc) { out.push({ deliveryId: id, status: this.recentStatus(g, id) }); continue }
      const o = loc.w.outstanding.get(loc.offset)
      if (!o || o.state === 'completing') { out.push({ deliveryId: id, status: 'already_completed' }); continue }
      // Only the current attempt can be nacked; an older id names an attempt already settled.
      if (o.state !== 'in_flight' || o.entry?.deliveryId !== id) { out.push({ deliveryId: id, status: 'already_completed' }); continue }
      this.cancel(o)
      o.open.delete(id)
      this.deps.attempts.update({ id, outcome: 'nacked', finishedAt: new Date(this.now()) })
      // The push's answer is still to come: it says why (settleAttempt acts on the nack then).
      if (o.pushing === id) o.nackedPush = { id, delayMs, deadLetter }
      else this.nacked(g, loc.w, o, 'nacked', delayMs, deadLetter)
      out.push({ deliveryId: id, status: 'nacked' })
    }
    // The others are applied; the caller asks again, and the partition's new owner answers for these.
    if (moved) throw movedError()
    return out
  }

  /** A nacked attempt: dead-lettered at once when asked, else a failed attempt. */
  private nacked(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, delayMs: number | undefined, deadLetter: boolean): void {
    if (deadLetter) {
      // Kept as the last error too: a dead letter whose write fails is retried with this text.
      o.lastError = `${error}; dead-lettered by the nack`
      this.deadLetter(g, w, o, o.lastError)
    } else {
      this.failed(g, w, o, error, undefined, delayMs)
    }
  }

  /** Extends ack deadlines to now + extendMs. */
  async extend(groupName: string, deliveryIds: string[], extendMs: number): Promise<{ deliveryId: string; status: AckStatus }[]> {
    const g = this.groups.get(groupName)
    const out: { deliveryId: string; status: AckStatus }[] = []
    let moved = false
    for (const id of deliveryIds) {
      const loc = g ? await this.locate(g, id) : null
      if (loc === 'moved') { moved = true; continue }
      if (!g || !loc) { out.push({ deliveryId: id, status: this.recentStatus(g, id) }); continue }
      const deadlineMs = this.now() + extendMs
      if (this.tracker.touch(id, deadlineMs)) {
        this.deps.attempts.update({ id, ackDeadline: new Date(deadlineMs) })
        this.armTimer()
        out.push({ deliveryId: id, status: 'extended' })
      } else {
        out.push({ deliveryId: id, status: 'already_completed' })
      }
    }
    if (moved) throw movedError()
    return out
  }

  // ---- reading and pushing ----

  private fill(g: GroupRuntime, w: PartitionState): void {
    if (this.stopped || g.dropped || w.dropped || w.releasing) return
    // Nothing to push to: read nothing (a consumer joining, or unpausing, calls fill again).
    if (g.row.paused || !g.owners[w.partition]) return
    const ordered = g.row.ordered
    const limit = ordered ? 1 : g.row.maxInFlight
    const win = this.windows.of(g.owners[w.partition]!.id)
    // Messages that fell due while the partition or the consumer's window was full go first, in order.
    while (w.ready.length > 0 && active(w) < limit) {
      if (!win.window.hasRoom()) return this.windows.wait(win, g, w)
      this.startPush(g, w, w.ready[0]!)
    }
    while ((ordered ? w.outstanding.size : active(w)) < limit && w.delayed < MAX_DELAYED) {
      if (!win.window.hasRoom()) return this.windows.wait(win, g, w)
      const msg = w.buffer.shift()
      if (!msg) {
        if (!w.reading && w.readPos < w.endHint) void this.read(g, w)
        return
      }
      if (msg.offset < w.readPos) continue
      w.readPos = msg.offset + 1
      if (msg.offset < w.committed || w.completed.has(msg.offset)) continue
      const o: Outstanding = {
        msg, attempts: w.priorAttempts.get(msg.offset) ?? 0, state: 'parked', entry: undefined, ids: [], open: new Set(), lastError: undefined,
      }
      w.priorAttempts.delete(msg.offset)
      w.outstanding.set(msg.offset, o)
      if (msg.availableAtMs > this.now()) this.schedule(g, w, o, 'delayed', msg.availableAtMs)
      else this.startPush(g, w, o)
    }
  }

  /** Moves a message to another state, keeping the partition's delayed count and ready queue right. */
  private setState(w: PartitionState, o: Outstanding, state: State): void {
    if (o.state === 'delayed') w.delayed--
    if (o.state === 'ready') w.ready.splice(w.ready.indexOf(o), 1)
    o.state = state
    if (state === 'delayed') w.delayed++
    if (state === 'ready') w.ready.push(o)
  }

  private async read(g: GroupRuntime, w: PartitionState): Promise<void> {
    w.reading = true
    const epoch = w.epoch
    const hint = w.endHint
    let rows: DispatchMessage[]
    try {
      rows = await readForDispatch(this.deps.db, g.topic.id, w.partition, w.readPos, READ_BATCH)
    } catch (err) {
      this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reading messages failed; retrying in 1 s')
      this.timers.setTimeout(() => this.safely(() => this.fill(g, w)), 1000)
      return
    } finally {
      w.reading = false
    }
    // A seek moved the partition meanwhile: drop these rows and read from the new position.
    if (epoch === w.epoch) {
      // Caught up: wait for produce to say more, unless it already did while this read ran.
      if (rows.length === 0 && w.endHint === hint) w.endHint = w.readPos
      // Offsets are dense, so a hole before or between rows is retention at work: those messages
      // can never be pushed, and the committed offset may pass them.
      let expected = w.readPos
      for (const row of rows) {
        if (row.offset > expected) w.gaps.push([expected, row.offset])
        expected = row.offset + 1
      }
      w.buffer.push(...rows)
    }
    this.safely(() => this.fill(g, w))
  }

  /** Runs a step of the dispatcher outside any caller that could handle its error: logs instead of crashing. */
  private safely(fn: () => void): void {
    try {
      fn()
    } catch (err) {
      this.deps.log.error({ err }, 'dispatcher step failed')
    }
  }

  private startPush(g: GroupRuntime, w: PartitionState, o: Outstanding): void {
    const owner = g.owners[w.partition]
    if (g.row.paused || !owner || this.stopped || w.releasing || w.dropped) { this.setState(w, o, 'parked'); return }
    // Attempts made before a restart count: one that already had them all is dead-lettered now.
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, o.lastError ?? `${o.attempts} attempts before a restart`)
    // The consumer has as many pushes under way as it has shown it can take: wait for one to end.
    const win = this.windows.of(owner.id)
    if (!win.window.hasRoom()) {
      this.setState(w, o, 'ready')
      return this.windows.wait(win, g, w)
    }
    // A first push goes out only below the partition's reservation, so a crash can never make the
    // next process push a message as attempt 1 again (see reserve()).
    if (o.attempts === 0 && o.msg.offset >= w.reservedTo) {
      this.setState(w, o, 'reserving')
      return this.reserve(g, w)
    }
    const attempt = ++o.attempts
    if (attempt > 1) this.deps.metrics?.redelivered(g.row.name)
    const id = newDeliveryId({ groupId: g.row.id, partition: w.partition, offset: o.msg.offset, attempt })
    const nowMs = this.now()
    const deadlineMs = nowMs + g.row.ackTimeoutMs
    o.ids.push(id)
    o.open.add(id)
    this.deliveries.issue(id, { g, w, offset: o.msg.offset })
    this.setState(w, o, 'in_flight')
    o.entry = this.tracker.insert(new TrackerEntry({
      deliveryId: id, groupId: g.row.id, partition: w.partition, offset: o.msg.offset, attempt, deadlineMs, kind: 'in_flight',
    }))
    this.armTimer()
    const row = {
      id, groupId: g.row.id, topicId: g.topic.id, partition: w.partition, offset: o.msg.offset, attempt,
      consumerId: owner.id, startedAt: new Date(nowMs), ackDeadline: new Date(deadlineMs),
    }
    // The window's slot is taken now, while it is known to be free; settlePush (or giveBack) returns it.
    win.window.acquire()
    if (attempt === 1) {
      this.deps.attempts.started(row)
      return this.send(g, w, o, id, owner, attempt, deadlineMs, nowMs)
    }
    // A retry's row is written before its push: a crash then leaves the attempt on record, and the
    // next process counts it (retries are few, so waiting for the write costs little).
    const current = () => w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.entry?.deliveryId === id
    const giveBack = () => {
      win.window.release('neutral')
      this.windows.wake(owner.id, (g, w) => this.safely(() => this.fill(g, w)))
    }
    // With a check, in the database, that this process still holds the partition's epoch: one
    // that lost it (paused past its session, say) must not push for it again.
    const fence = new Promise<boolean>((resolve, reject) => this.progress.reserve(g, w, w.reservedTo, resolve, reject))
    Promise.all([this.deps.attempts.durable(row), fence]).then(([, held]) => {
      if (!held) { giveBack(); return this.moved(g, w) }
      if (current() && !this.stopped && !w.releasing) this.send(g, w, o, id, owner, attempt, deadlineMs, this.now())
      else giveBack()
    }, (err: unknown) => {
      giveBack()
      if (!current()) return
      // Not pushed, and not on record: the attempt did not happen. Try again in a second.
      this.deps.log.error({ err, group: g.row.name, partition: w.partition, offset: o.msg.offset }, 'recording a retry failed; retrying in 1 s')
      this.cancel(o)
      o.attempts--
      o.ids.pop()
      o.open.delete(id)
      this.deliveries.withdraw(id)
      this.schedule(g, w, o, 'retry_wait', this.now() + 1000)
    }).catch((err: unknown) => this.deps.log.error({ err, group: g.row.name }, 'starting a retry failed'))
  }

  /** Sends one push: the attempt is on its way from here, and settlePush gets its answer. */
  private send(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string, owner: ConsumerRow, attempt: number, deadlineMs: number, nowMs: number): void {
    let request: ReturnType<typeof buildPush>
    try {
      request = buildPush({
        groupName: g.row.name, topicName: g.topic.name, topicId: g.topic.id, partition: w.partition,
        pushFormat: g.row.pushFormat, consumerSecrets: signingSecrets(owner, nowMs),
      }, o.msg, id, attempt, deadlineMs, nowMs)
    } catch (err) {
      // Nothing went out: the slot goes back, and the ack deadline retries the attempt.
      this.windows.find(owner.id)?.window.release('neutral')
      throw err
    }
    const { body, headers } = request
    o.pushedTo = owner.id
    o.pushing = id
    sendPush(this.deps.agent, { url: owner.url, body, headers, timeoutMs: g.row.pushTimeoutMs },
      (result) => this.safely(() => this.settlePush(g, w, o, id, owner, result)))
  }

  /**
   * Records that first pushes of the partition's waiting offsets may be made, then pushes them.
   * One reservation covers every message that reached the wall meanwhile (a read batch, a produce
   * batch), and the writes of all partitions go together, so it is one small write per batch, not
   * per push. After a crash the reserved offsets without an attempt row count one attempt each:
   * pushed or not, they were about to be (only a consumer's window filling up in between leaves
   * one waiting).
   */
  private reserve(g: GroupRuntime, w: PartitionState): void {
    if (w.reserving) return
    // Exactly the offsets waiting to go out now: a reservation past them (the next maxInFlight
    // offsets, as once) would make a restart count an attempt for messages never pushed, even for
    // ones not yet produced, and dead-letter them at maxDeliveries 1.
    let last = -1
    for (const o of w.outstanding.values()) if (o.state === 'reserving' && o.msg.offset > last) last = o.msg.offset
    if (last < 0) return
    w.reserving = true
    const epoch = w.epoch
    const to = last + 1
    const resume = () => {
      if (w.epoch !== epoch || w.dropped) return // a seek reset the partition (and its reservation)
      w.reserving = false
      for (const o of [...w.outstanding.values()]) if (o.state === 'reserving') this.startPush(g, w, o)
      this.fill(g, w)
    }
    this.progress.reserve(g, w, to, (held) => {
      if (!held) return this.moved(g, w)
      this.safely(resume)
    }, (err: unknown) => {
      this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reserving pushes failed; retrying in 1 s')
      this.timers.setTimeout(() => this.safely(resume), 1000)
    })
  }

  private settlePush(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string, owner: ConsumerRow, r: PushResult): void {
    this.deps.metrics?.pushed(g.row.name, r.kind, r.durationMs / 1000)
    this.windows.find(owner.id)?.window.release(pushSignal(r))
    try {
      this.settleAttempt(g, w, o, id, owner, r)
    } finally {
      // After the attempt is settled, so a retry it scheduled and new messages compete fairly for the room.
      this.windows.wake(owner.id, (g, w) => this.safely(() => this.fill(g, w)))
    }
  }

  private settleAttempt(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string, owner: ConsumerRow, r: PushResult): void {
    const finishedAt = new Date(this.now())
    if (o.pushing === id) o.pushing = undefined
    // A partition being handed over waits for its last push to be answered.
    if (w.releasing && w.onIdle && ![...w.outstanding.values()].some((x) => x.pushing)) queueMicrotask(w.onIdle)
    const nack = o.nackedPush?.id === id ? o.nackedPush : undefined
    if (nack) {
      o.nackedPush = undefined
      if (w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && !o.entry) {
        const why = r.kind === 'delivered' ? undefined : errorOf(r, g.row.pushTimeoutMs)
        this.deps.attempts.update({ id, durationMs: r.durationMs, ...(r.kind === 'rejected' ? { statusCode: r.status } : {}), ...(why ? { error: why } : {}) })
        // 410 Gone disables the consumer whichever way the attempt was settled.
        if (r.kind === 'rejected' && r.status === 410) this.disable(g, owner)
        return this.nacked(g, w, o, why ? `nacked: ${why}` : 'nacked', nack.delayMs, nack.deadLetter)
      }
    }
    const current = w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.entry?.deliveryId === id
    if (r.kind === 'delivered') {
      this.deps.attempts.update({ id, statusCode: r.status, durationMs: r.durationMs })
      if (current && g.row.ackMode === 'auto') {
        this.cancel(o)
        this.setState(w, o, 'completing')
        const req: CompletionRequest = { g, w, epoch: w.epoch, offset: o.msg.offset, outcome: 'acked' }
        this.progress.complete(req,
          (status) => this.safely(() => this.completed(req, id, status === 'acked' ? 'acked' : undefined)),
          (err: unknown) => { this.deps.log.error({ err }, 'recording an auto ack failed; the message will be pushed again'); this.safely(() => this.completionFailed(req)) })
      }
      return
    }
    const error = errorOf(r, g.row.pushTimeoutMs)
    // Not current: the message was acked (or the partition seeked) while the push was under way;
    // the attempt row keeps the outcome that gave it, with this answer's details.
    this.deps.attempts.update({
      id, finishedAt, durationMs: r.durationMs, error, ...(current ? { outcome: 'failed' as const } : {}),
      ...(r.kind === 'rejected' ? { statusCode: r.status } : {}),
    })
    if (r.kind === 'rejected' && r.status === 410) this.disable(g, owner)
    if (!current) return
    o.open.delete(id)
    this.cancel(o)
    this.failed(g, w, o, error, r.kind === 'rejected' ? r.retryAfterMs : undefined)
  }

  /** A failed attempt: dead-letter after maxDeliveries, else wait out the backoff. */
  private failed(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, retryAfterMs?: number, delayMs?: number): void {
    o.lastError = error
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, error)
    const waitMs = delayMs ?? honourRetryAfterMs(nextDelayMs(o.attempts, g.policy), retryAfterMs, g.policy)
    this.schedule(g, w, o, 'retry_wait', this.now() + waitMs)
  }

  private deadLetter(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string): void {
    this.setState(w, o, 'completing')
    const req: CompletionRequest = { g, w, epoch: w.epoch, offset: o.msg.offset, outcome: 'dead' }
    const dlq = g.row.deadLetterTopic
    const finish = async () => {
      if (dlq) {
        const topic = await this.deps.topics.findByName(dlq)
        if (!topic) throw new Error(`dead-letter topic ${dlq} does not exist`)
        req.deadLetter = deadLetterEntry(g, w, o, topic, error)
      }
      return this.completeAll([req])
    }
    finish().then(([status]) => {
      // An ack can win the race with the dead-lettering; then the message is simply acked.
      if (status === 'dead') this.deps.metrics?.deadLettered(g.row.name)
      this.completed(req, o.ids.at(-1), status === 'dead' ? 'dead' : undefined)
    }, (err: unknown) => {
      this.deps.log.error({ err, group: g.row.name, partition: w.partition, offset: o.msg.offset }, 'dead-lettering failed; retrying in 5 s')
      // Unless an ack or a seek settled the message meanwhile.
      if (w.outstanding.get(o.msg.offset) !== o || o.state !== 'completing' || req.epoch !== w.epoch) return
      this.cancel(o)
      this.schedule(g, w, o, 'retry_wait', this.now() + 5000, true)
    }).catch((err: unknown) => this.deps.log.error({ err }, 'settling a dead letter failed'))
  }

  /** Puts a message on the timer: a delayed first push, or a retry. */
  private schedule(g: GroupRuntime, w: PartitionState, o: Outstanding, state: 'delayed' | 'retry_wait', atMs: number, deadLetterAgain = false): void {
    this.setState(w, o, state)
    o.entry = this.tracker.insert(new TrackerEntry({
      // Waits are tracked under a key of their own (no delivery id names them); the kind says what ends them.
      deliveryId: `~${++this.waitSeq}`, groupId: g.row.id, partition: w.partition, offset: o.msg.offset, attempt: o.attempts,
      deadlineMs: atMs, kind: state === 'delayed' ? 'delayed' : deadLetterAgain ? 'dead_letter_retry' : 'retry_wait',
    }))
    this.armTimer()
  }

  private cancel(o: Outstanding): void {
    if (o.entry) this.tracker.finish(o.entry.deliveryId)
    o.entry = undefined
  }

  private armTimer(): void {
    const next = this.tracker.nextDeadlineMs()
    if (next === undefined || this.stopped) { this.timers.clearTimeout(this.timer); this.timer = undefined; this.timerAtMs = Infinity; return }
    if (this.timer && next >= this.timerAtMs) return
    this.timers.clearTimeout(this.timer)
    this.timerAtMs = next
    this.timer = this.timers.setTimeout(() => this.onTimer(), Math.max(0, next - this.now()))
  }

  private onTimer(): void {
    this.timer = undefined
    this.timerAtMs = Infinity
    const { due } = this.tracker.expireDue(this.now(), 10_000)
    // One failing entry must not strand the rest of the batch: they are out of the tracker already.
    for (const entry of due) this.safely(() => this.onDue(entry))
    this.armTimer()
  }

  private onDue(entry: TrackerEntry): void {
    const found = this.findOutstanding(entry)
    if (!found) return
    const { g, w, o } = found
    o.entry = undefined
    if (entry.kind === 'in_flight') {
      o.open.delete(entry.deliveryId)
      this.deps.attempts.update({ id: entry.deliveryId, outcome: 'timed_out', finishedAt: new Date(this.now()), error: `no ack within ${g.row.ackTimeoutMs} ms` })
      // Took the push but not the message in time: as much a sign of overload as a slow answer.
      if (o.pushedTo) this.windows.find(o.pushedTo)?.window.shrink()
      this.failed(g, w, o, `no ack within ${g.row.ackTimeoutMs} ms`)
    } else if (entry.kind === 'dead_letter_retry') {
      this.deadLetter(g, w, o, o.lastError ?? 'dead-lettered')
    } else if (entry.kind === 'delayed' && !g.row.ordered) {
      // Due now, and active from here on: wait for a slot if the partition is full.
      this.setState(w, o, 'parked')
      if (active(w) > g.row.maxInFlight) this.setState(w, o, 'ready')
      else this.startPush(g, w, o)
    } else {
      this.startPush(g, w, o)
    }
  }

  private findOutstanding(entry: TrackerEntry) {
    const g = this.groupsById.get(entry.groupId)
    const w = g?.parts.get(entry.partition)
    const o = w?.outstanding.get(entry.offset)
    return g && w && o && o.entry === entry ? { g, w, o } : undefined
  }

  // ---- completion ----

  /**
   * Where a delivery id points, if this group issued it; `moved` when its partition is not pushed
   * here (another process owns it, or it is being handed over): its owner answers for it.
   */
  private async locate(g: GroupRuntime, id: string): Promise<{ w: PartitionState; offset: number } | null | 'moved'> {
    // Ids in memory are of partitions owned here: dropping a partition forgets its ids.
    const known = this.deliveries.find(id)
    if (known) return known.g !== g ? null : known.w.releasing ? 'moved' : known
    // Not in memory: issued before a restart or by another process, or its message completed already.
    // The id names its partition: one not pushed here is its owner's to answer, whether or not its
    // attempt row is written yet (a first push's row waits for its outcome).
    const key = parseDeliveryId(id)
    if (!key || key.groupId !== g.row.id || key.partition >= g.topic.partitions) return null
    const w = g.parts.get(key.partition)
    if (!w || w.releasing) return 'moved'
    const row = await findAttempt(this.deps.db, g.row.id, id)
    if (!row || row.topicId !== g.topic.id || row.partition !== key.partition) return null
    return row.startedAt.getTime() >= w.seekAtMs ? { w, offset: row.offset } : null
  }

  /** Completes the messages together; their statuses once durable. */
  private completeAll(reqs: CompletionRequest[]): Promise<CompletionStatus[]> {
    if (reqs.length === 0) return Promise.resolve([])
    return new Promise((resolve, reject) => {
      const statuses = new Array<CompletionStatus>(reqs.length)
      let waiting = reqs.length
      let failed = false
      reqs.forEach((req, k) => this.progress.complete(req, (status) => {
        statuses[k] = status
        if (--waiting === 0 && !failed) resolve(statuses)
      }, (err) => {
        if (!failed) { failed = true; reject(err) }
      }))
    })
  }

  /** After a completion is durable: forget the message, log the outcome, push the next. */
  private completed(req: CompletionRequest, deliveryId: string | undefined, outcome: 'acked' | 'dead' | undefined): void {
    if (req.epoch !== req.w.epoch) return // a seek reset the partition: nothing here is ours any more
    const o = req.w.outstanding.get(req.offset)
    const finishedAt = new Date(this.now())
    if (o) {
      this.cancel(o)
      this.setState(req.w, o, 'completing')
      req.w.outstanding.delete(req.offset)
      this.deliveries.complete(o.ids, req.w)
      // Attempts still open end with the message's outcome (a late ack of attempt 1 also
      // settles attempt 2, which was pushed meanwhile).
      for (const id of o.open) {
        this.deps.attempts.update(outcome ? { id, outcome, finishedAt }
          : { id, outcome: 'failed', finishedAt, error: 'the message was completed by another attempt' })
      }
    }
    if (deliveryId && outcome && !(o?.open.has(deliveryId))) this.deps.attempts.update({ id: deliveryId, outcome, finishedAt })
    this.fill(req.g, req.w)
  }

  /** A completion could not be written: the message stays outstanding and is pushed again soon. */
  private completionFailed(req: CompletionRequest): void {
    const o = req.w.outstanding.get(req.offset)
    if (req.epoch !== req.w.epoch || !o || o.state !== 'completing' || req.w.completed.has(req.offset)) return
    this.schedule(req.g, req.w, o, 'retry_wait', this.now() + 1000)
  }

  /** Each consumer's push window, for the metrics. */
  pushWindows(): PushWindowStat[] {
    return this.windows.stats()
  }

  // ---- consumers and groups ----

  private setConsumers(g: GroupRuntime, consumers: ConsumerRow[]): void {
    const kept = new Set(consumers.map((c) => c.id))
    for (const c of g.consumers) if (!kept.has(c.id)) this.windows.forget(c.id)
    g.consumers = consumers
    const owners = assignPartitions(g.topic.partitions, consumers)
    g.owners = owners.map((id) => consumers.find((c) => c.id === id) ?? null)
    // Messages parked for want of a consumer (or while paused) go out now, then new ones.
    for (const w of g.parts.values()) {
      for (const o of w.outstanding.values()) if (o.state === 'parked') this.startPush(g, w, o)
      this.fill(g, w)
    }
  }

  /**
   * 410 Gone: the consumer gets nothing more until registered again. Disabled in memory at once,
   * so the retry that follows goes to the partition's new owner, then recorded in the database.
   */
  private disable(g: GroupRuntime, owner: ConsumerRow): void {
    if (owner.disabledAt !== null) return
    owner.disabledAt = new Date(this.now())
    owner.disabledReason = 'answered 410 Gone'
    this.setConsumers(g, g.consumers)
    this.deps.disableConsumer(owner.id, 'answered 410 Gone').catch((err: unknown) =>
      this.deps.log.error({ err, consumer: owner.id }, 'recording a disabled consumer failed'))
  }

  private drop(g: GroupRuntime): void {
    g.dropped = true
    for (const c of g.consumers) this.windows.forget(c.id)
    for (const w of g.parts.values()) {
      w.dropped = true
      for (const o of w.outstanding.values()) this.abandon(o, 'abandoned: the group or its topic changed')
    }
    this.groups.delete(g.row.name)
    if (this.groupsById.get(g.row.id) === g) this.groupsById.delete(g.row.id)
    this.armTimer()
  }
}

/** What a failed push's answer says, for the attempt log and dead letters. */
/** An ack for a partition that is moving between processes: the caller tries again (acks are idempotent). */
function movedError(): HookqError {
  return new HookqError('unavailable', 'a partition of these deliveries is moving to another broker process; retry', { retryAfterS: 1 })
}

function errorOf(r: Exclude<PushResult, { kind: 'delivered' }>, pushTimeoutMs: number): string {
  return r.kind === 'rejected' ? `HTTP ${r.status}${r.body ? `: ${r.body.slice(0, 200)}` : ''}`
    : r.kind === 'timeout' ? `no answer within ${pushTimeoutMs} ms` : r.error
}

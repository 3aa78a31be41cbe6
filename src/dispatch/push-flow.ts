/**
 * The way of a message through its pushes, for the partitions this process owns:
 *
 *   fill ─▶ delayed ──due──▶ start ─▶ reserving ─▶ in_flight ──settle: 2xx (auto) / ack──▶ completing ──written──▶ gone
 *                              │  ▲                    │  fail / deadline / nack            │
 *                              │  └──── retry_wait ◀───┘                                    │ not written: retry in 1 s
 *                              │                       └─ attempts = maxDeliveries ─▶ completing (dead letter)
 *                              └▶ parked (no consumer, paused) / ready (partition or consumer window full)
 *
 * Invariant: every push attempt ends in exactly one outcome (acked, failed, timed_out, nacked or
 * dead) and has exactly one attempt row, written once its outcome is known (or as in_flight if
 * that takes long, then updated; see attempt-log.ts). The one exception to "written once": the
 * attempt after which its message is dead-lettered ends failed, timed_out or nacked, and its row is
 * then marked dead; its finish time, status code and error stay those of the attempt.
 *
 * - `fill` admits messages from the partition's buffer while the partition has room (maxInFlight
 *   active; one outstanding of any state when ordered) and the consumer's push window too.
 * - A first push goes out only below the partition's reservation (group_offsets.pushed_offset), a
 *   retry only once its attempt row is written and the owner epoch checked: a crash can never make
 *   the next owner push a message as attempt 1 again, and a process that lost the partition pushes
 *   nothing more for it.
 * - Completions (auto acks, dead letters) are written by the progress writer; `completed` then
 *   forgets the message and fills the partition again.
 */
import type { ConsumerRow } from '../store/groups.ts'
import type { DispatchMessage } from '../store/consumption.ts'
import type { Database } from '../store/db.ts'
import type { TopicRow } from '../store/topics.ts'
import { newDeliveryId } from '../store/delivery-id.ts'
import type { AttemptStart } from '../store/deliveries.ts'
import type { DispatchMetrics } from '../metrics.ts'
import type { AttemptLog } from './attempt-log.ts'
import { assignPartitions } from './consumer-assignment.ts'
import type { ConsumerWindows } from './consumer-windows.ts'
import { authOf } from './push-auth.ts'
import { buildBatchPush, buildEnvelope, buildPush, signingSecrets, type PushTarget } from './envelope.ts'
import { attemptEnded, recordDeadLetter, startAttempt } from './tracing.ts'
import { Batches, type BatchEntry } from './batches.ts'
import { READ_AHEAD, type PartitionReader } from './partition-reader.ts'
import type { ProgressWriter } from './progress.ts'
import { send as sendPush, type PushAgent, type PushResult } from './pusher.ts'
import { pushSignal, type PushSignal } from './push-window.ts'
import { honourRetryAfterMs, nextDelayMs } from './retry-policy.ts'
import type { Schedule, Timers } from './schedule.ts'
import type { TrackerEntry } from './tracker.ts'
import { Wait } from './waits.ts'
import type { HealthRecorder } from './health.ts'
import {
  active,
  addId,
  closeAttempt,
  EMPTY,
  deadLetterEntry,
  newOutstanding,
  setState,
  type CompletionRequest,
  type GroupRuntime,
  type Outstanding,
  type PartitionState,
} from './partition-state.ts'

/** Delayed messages held per partition at most (beyond maxInFlight); later ones wait in the log. */
const MAX_DELAYED = 1000
/** Bytes of a batch's answer read (a `failed` list of 1000 delivery ids is about 45 KB). */
const BATCH_ANSWER_BYTES = 64 * 1024
/** Messages held per partition behind their keys' outstanding ones (ordering "key") at most; later ones wait in the log. */
const MAX_KEY_QUEUED = 10_000

export interface PushFlowDeps {
  db: Database
  findTopic(name: string): Promise<TopicRow | null>
  attempts: AttemptLog
  agent: PushAgent
  log: { error(obj: object, msg: string): void }
  metrics?: DispatchMetrics
  now(): number
  timers: Timers
  schedule: Schedule
  windows: ConsumerWindows
  progress: ProgressWriter
  reader: PartitionReader
  /** The runtime of a group loaded here, by id. */
  group(groupId: number): GroupRuntime | undefined
  /** True once the dispatcher is stopping: nothing new goes out. */
  stopped(): boolean
  /** Records a consumer of the group as disabled (410 Gone) at `at`. */
  disableConsumer(groupId: number, id: string, reason: string, at: Date): Promise<void>
  /** A write for the partition was refused for its owner epoch: it is not this process's any more. */
  moved(g: GroupRuntime, w: PartitionState): void
  /** Each consumer's successes and failures, for its health. */
  health?: HealthRecorder
}

export class PushFlow {
  private readonly batches: Batches

  constructor(private readonly deps: PushFlowDeps) {
    this.batches = new Batches({
      timers: deps.timers,
      send: (g, w, owner, entries) => this.safely(() => this.sendBatch(g, w, owner, entries)),
      opened: (owner) => deps.windows.batchOpened(owner.id),
    })
  }

  // ---- admission ----

  /** Admits what may go out now: messages that fell due while there was no room, then the buffer's. */
  fill(g: GroupRuntime, w: PartitionState): void {
    if (this.deps.stopped() || g.dropped || w.dropped || w.releasing) return
    // Nothing to push to: read nothing (a consumer joining, or unpausing, calls fill again).
    const owner = g.owners[w.partition]
    if (g.row.paused || !owner) return
    const ordering = g.row.ordering
    const limit = ordering === 'partition' ? 1 : g.row.maxInFlight
    const windows = this.deps.windows
    const win = windows.of(owner.id)
    while (w.ready.length > 0 && active(w) < limit) {
      const joining = this.batches.isOpen(w, owner)
      if (!windows.hasRoom(win, joining)) return windows.wait(win, owner.id, g, w, joining)
      this.start(g, w, w.ready[0]!)
    }
    const nowMs = this.deps.now()
    const byKey = ordering === 'key' ? w.keys : undefined
    while ((ordering === 'partition' ? w.outstanding.size : active(w)) < limit && w.delayed < MAX_DELAYED) {
      const joining = this.batches.isOpen(w, owner)
      if (!windows.hasRoom(win, joining)) return windows.wait(win, owner.id, g, w, joining)
      const next = w.buffer[0]
      if (!next) return this.deps.reader.read(g, w)
      // Keys that hold many messages back: read no further until some complete (memory stays bounded).
      if (byKey && byKey.queued >= MAX_KEY_QUEUED && next.key !== null && byKey.isBusy(next.key)) return
      const msg = w.buffer.shift()!
      if (msg.offset < w.readPos) continue
      w.readPos = msg.offset + 1
      if (msg.offset < w.committed || w.completed.has(msg.offset)) continue
      // The filter, once per message: now for one that may go now, when its delay ends otherwise
      // (the filter may change meanwhile). One pushed before a restart goes on being pushed.
      const due = msg.availableAtMs <= nowMs
      if (due && g.filter && !w.priorAttempts.has(msg.offset) && !g.filter(msg)) {
        this.filterOut(g, w, msg.offset)
        continue
      }
      if (byKey && !byKey.take(msg)) continue // waits behind its key's outstanding message
      this.admit(g, w, msg, due, nowMs)
    }
    if (w.buffer.length < READ_AHEAD) this.deps.reader.read(g, w)
  }

  /**
   * The group's ordering changed. To "key": the messages already out hold their keys (later ones
   * of those keys wait for all of them). From "key": the messages waiting behind their keys are
   * outstanding now, in offset order, ready to go as the new ordering and maxInFlight allow.
   */
  orderingChanged(g: GroupRuntime, previous: GroupRuntime['row']['ordering']): void {
    const nowMs = this.deps.now()
    for (const w of g.parts.values()) {
      if (g.row.ordering === 'key') {
        for (const o of w.outstanding.values()) if (o.msg.key !== null) w.keys.hold(o.msg.key)
      } else if (previous === 'key') {
        for (const msg of w.keys.drain()) this.admit(g, w, msg, false, nowMs, true)
      }
      this.fill(g, w)
    }
  }

  /**
   * Makes a message outstanding: it waits for its delay, or starts (or, `ready`, waits for room
   * like a message that fell due). `matched`: the filter was checked.
   */
  private admit(g: GroupRuntime, w: PartitionState, msg: DispatchMessage, matched: boolean, nowMs: number, ready = false): void {
    const attempts = w.priorAttempts.get(msg.offset) ?? 0
    if (w.priorAttempts.size > 0) w.priorAttempts.delete(msg.offset)
    const heldUntil = w.heldUntil.size > 0 ? w.heldUntil.get(msg.offset) : undefined
    if (heldUntil !== undefined) w.heldUntil.delete(msg.offset)
    const o = newOutstanding(msg, attempts, matched)
    w.outstanding.set(msg.offset, o)
    // The previous owner's push is the consumer's until its ack deadline (a graceful handover): no duplicate before then.
    if (heldUntil !== undefined && attempts > 0 && heldUntil > nowMs) this.wait(g, w, o, 'retry', heldUntil)
    else if (msg.availableAtMs > nowMs) this.wait(g, w, o, 'delay', msg.availableAtMs)
    else if (ready) setState(w, o, 'ready')
    else this.start(g, w, o)
  }

  /**
   * A message is no longer outstanding (completed, or filtered out before its first push). In
   * ordering "key" its key goes to the key's next message, admitted now: a queued message was
   * admitted in offset order already, so it does not wait for room in the partition.
   */
  private forget(g: GroupRuntime, w: PartitionState, o: Outstanding): void {
    w.outstanding.delete(o.msg.offset)
    if (g.row.ordering !== 'key' || o.msg.key === null) return
    const next = w.keys.release(o.msg.key)
    // Checked by the filter when it starts (it may have changed while the message waited).
    if (next) this.admit(g, w, next, false, this.deps.now())
  }

  /**
   * The group's consumers changed (or one was disabled): each partition's consumer is chosen
   * again, and messages parked for want of one (or while paused) go out, then new ones.
   */
  consumersChanged(g: GroupRuntime, consumers: ConsumerRow[]): void {
    const kept = new Set(consumers.map((c) => c.id))
    for (const c of g.consumers) if (!kept.has(c.id)) this.deps.windows.forget(c.id)
    g.consumers = consumers
    const owners = assignPartitions(g.topic.partitions, consumers)
    g.owners = owners.map((id) => consumers.find((c) => c.id === id) ?? null)
    this.limitConsumers(g)
    for (const w of g.parts.values()) {
      for (const o of w.outstanding.values()) if (o.state === 'parked') this.start(g, w, o)
      this.fill(g, w)
    }
  }

  /**
   * Gives each consumer of the group its fixed limits (rateLimitPerSecond, maxConcurrency), scaled
   * to the share of its partitions this process pushes: called when the consumers change and when
   * a partition of the group comes or goes.
   */
  limitConsumers(g: GroupRuntime): void {
    const total = new Map<string, number>()
    const here = new Map<string, number>()
    g.owners.forEach((c, p) => {
      if (!c) return
      total.set(c.id, (total.get(c.id) ?? 0) + 1)
      if (g.parts.has(p)) here.set(c.id, (here.get(c.id) ?? 0) + 1)
    })
    for (const c of g.consumers) {
      const n = total.get(c.id)
      if (n) this.deps.windows.limit(c.id, c, (here.get(c.id) ?? 0) / n, g.row.batchMaxMessages !== null)
    }
  }

  // ---- the filter ----

  /**
   * Completes a message the group's filter does not match: no push, no attempt, no attempt row.
   * It takes no slot and nothing waits for the write: until it is written, the partition's
   * committed offset cannot pass it (the progress writer moves it in the same statement that
   * counts it), and after a crash the next owner reads the message again and filters it again.
   */
  private filterOut(g: GroupRuntime, w: PartitionState, offset: number): void {
    this.deps.metrics?.filtered(g.row.name)
    const req: CompletionRequest = { g, w, offset, outcome: 'filtered' }
    const write = () =>
      this.deps.progress.complete(
        req,
        () => {},
        (err: unknown) => {
          if (w.dropped) return
          this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'recording a filtered message failed; retrying in 1 s')
          this.deps.timers.setTimeout(() => {
            if (!w.dropped) write()
          }, 1000)
        },
      )
    write()
  }

  /** The group's filter changed: it applies to every message not pushed yet, those already admitted too. */
  filterChanged(g: GroupRuntime, filter: GroupRuntime['filter']): void {
    g.filter = filter
    for (const w of g.parts.values()) for (const o of w.outstanding.values()) if (o.attempts === 0) o.matched = false
  }

  // ---- a push ----

  private start(g: GroupRuntime, w: PartitionState, o: Outstanding): void {
    if (!o.matched && o.attempts === 0 && o.state !== 'reserving') {
      o.matched = true
      if (g.filter && !g.filter(o.msg)) {
        this.cancel(o)
        setState(w, o, 'completing')
        this.forget(g, w, o)
        this.filterOut(g, w, o.msg.offset)
        return this.fill(g, w)
      }
    }
    const owner = g.owners[w.partition]
    if (g.row.paused || !owner || this.deps.stopped() || w.releasing || w.dropped) return setState(w, o, 'parked')
    // Attempts made before a restart count: one that already had them all is dead-lettered now.
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, o.lastError ?? `${o.attempts} attempts before a restart`)
    // The consumer has as many pushes under way as it has shown it can take: wait for one to end.
    const win = this.deps.windows.of(owner.id)
    const joining = this.batches.isOpen(w, owner)
    if (!this.deps.windows.hasRoom(win, joining)) {
      setState(w, o, 'ready')
      return this.deps.windows.wait(win, owner.id, g, w, joining)
    }
    if (o.attempts === 0 && o.msg.offset >= w.reservedTo) {
      setState(w, o, 'reserving')
      return this.reserve(g, w)
    }
    const attempt = ++o.attempts
    if (attempt > 1) this.deps.metrics?.redelivered(g.row.name)
    const id = newDeliveryId({ groupId: g.row.id, partition: w.partition, offset: o.msg.offset, attempt })
    const nowMs = this.deps.now()
    const deadlineMs = nowMs + g.row.ackTimeoutMs
    addId(o, id)
    setState(w, o, 'in_flight')
    o.current = id
    // In auto mode the answer settles the attempt; a deadline is needed only if it can pass before the push's timeout.
    if (g.row.ackMode === 'explicit' || g.row.ackTimeoutMs < g.row.pushTimeoutMs) {
      o.inFlight = this.deps.schedule.ackDeadline(id, g.row.id, w.partition, o.msg.offset, attempt, deadlineMs)
    }
    // Every field from the start, the ones the outcome fills in too: a field added to an object
    // later changes its shape (a new hidden class, a larger backing store), at each push.
    const row: AttemptStart = {
      id,
      groupId: g.row.id,
      topicId: g.topic.id,
      partition: w.partition,
      offset: o.msg.offset,
      attempt,
      consumerId: owner.id,
      startedAtMs: nowMs,
      ackDeadlineMs: deadlineMs,
      outcome: undefined,
      finishedAtMs: undefined,
      statusCode: undefined,
      durationMs: undefined,
      error: undefined,
    }
    // The window's slot is taken now, while it is known to be free; settle (or giveBack) returns it.
    this.deps.windows.started(win)
    if (attempt === 1) {
      this.deps.attempts.started(row)
      return this.send(g, w, o, id, owner, attempt, deadlineMs, nowMs)
    }
    // A retry's row is written before its push: a crash then leaves the attempt on record, and the
    // next process counts it (retries are few, so waiting for the write costs little). With it, a
    // check that this process still holds the partition's epoch: one that lost it (paused past its
    // session, say) must not push for it again.
    const current = () => w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.current === id
    const giveBack = () => {
      win.window.release('neutral')
      this.deps.windows.wake(owner.id)
    }
    const fence = new Promise<boolean>((resolve, reject) => this.deps.progress.reserve(g, w, w.reservedTo, resolve, reject))
    // Until sent, a handover deletes its row: the next owner must not count a push never made.
    w.unsent.add(id)
    Promise.all([this.deps.attempts.durable(row), fence])
      .then(
        ([, held]) => {
          if (!held) {
            giveBack()
            return this.deps.moved(g, w)
          }
          if (current() && !this.deps.stopped() && !w.releasing) {
            w.unsent.delete(id)
            this.send(g, w, o, id, owner, attempt, deadlineMs, this.deps.now())
          } else {
            if (!w.releasing && !w.dropped && !this.deps.stopped()) w.unsent.delete(id)
            giveBack()
          }
        },
        (err: unknown) => {
          w.unsent.delete(id)
          giveBack()
          if (!current()) return
          // Not pushed, and not on record: the attempt did not happen. Try again in a second.
          this.deps.log.error(
            { err, group: g.row.name, partition: w.partition, offset: o.msg.offset },
            'recording a retry failed; retrying in 1 s',
          )
          this.cancel(o)
          o.attempts--
          o.ids.pop()
          closeAttempt(o, id)
          this.wait(g, w, o, 'retry', this.deps.now() + 1000)
        },
      )
      .catch((err: unknown) => this.deps.log.error({ err, group: g.row.name }, 'starting a retry failed'))
  }

  /**
   * Records that first pushes of the partition's waiting offsets may be made, then pushes them.
   * Exactly the offsets waiting to go out now: a reservation past them would make a restart count
   * an attempt for messages never pushed (and dead-letter them at maxDeliveries 1). One
   * reservation covers every message that reached it meanwhile, and the progress writer writes
   * those of all partitions together with the completions.
   */
  private reserve(g: GroupRuntime, w: PartitionState): void {
    if (w.reserving) return
    let last = -1
    for (const o of w.outstanding.values()) if (o.state === 'reserving' && o.msg.offset > last) last = o.msg.offset
    if (last < 0) return
    w.reserving = true
    const resume = () => {
      if (w.dropped) return
      w.reserving = false
      for (const o of [...w.outstanding.values()]) if (o.state === 'reserving') this.start(g, w, o)
      this.fill(g, w)
    }
    this.deps.progress.reserve(
      g,
      w,
      last + 1,
      (held) => {
        if (!held) return this.deps.moved(g, w)
        this.safely(resume)
      },
      (err: unknown) => {
        this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reserving pushes failed; retrying in 1 s')
        this.deps.timers.setTimeout(() => this.safely(resume), 1000)
      },
    )
  }

  /** Sends one push (or adds it to its partition's batch): the attempt is on its way from here, and settle gets its answer. */
  private send(
    g: GroupRuntime,
    w: PartitionState,
    o: Outstanding,
    id: string,
    owner: ConsumerRow,
    attempt: number,
    deadlineMs: number,
    nowMs: number,
  ): void {
    // The attempt's own span in the message's trace (recorded when tracing is on; see tracing.ts).
    const traceparent = startAttempt(o.msg, id, attempt, g.topic, g.row.name, w.partition, owner.url)
    if (g.row.batchMaxMessages !== null) {
      let envelope: string
      try {
        envelope = buildEnvelope(this.targetOf(g, w, owner, nowMs), o.msg, id, attempt, deadlineMs, traceparent)
      } catch (err) {
        attemptEnded(id, { kind: 'not_sent' })
        this.deps.windows.find(owner.id)?.window.release('neutral')
        throw err
      }
      o.pushedTo = owner.id
      o.pushing = id
      return this.batches.add(g, w, owner, { o, id, envelope, traceparent })
    }
    let request: ReturnType<typeof buildPush>
    try {
      request = buildPush(this.targetOf(g, w, owner, nowMs), o.msg, id, attempt, deadlineMs, nowMs, traceparent)
    } catch (err) {
      attemptEnded(id, { kind: 'not_sent' })
      // Nothing went out: the slot goes back, and the ack deadline retries the attempt.
      this.deps.windows.find(owner.id)?.window.release('neutral')
      throw err
    }
    o.pushedTo = owner.id
    o.pushing = id
    sendPush(
      this.deps.agent,
      {
        url: owner.url,
        body: request.body,
        headerLines: request.headerLines,
        timeoutMs: g.row.pushTimeoutMs,
        auth: authOf(this.deps.agent, owner, g.row.name),
      },
      (result) => this.safely(() => this.settle(g, w, o, id, owner, result)),
    )
  }

  /**
   * Sends a batch (see batches.ts): its attempts still current, in offset order, in one POST.
   * Each one keeps its slot in the consumer's window until the answer, like a single push.
   */
  private sendBatch(g: GroupRuntime, w: PartitionState, owner: ConsumerRow, entries: BatchEntry[]): void {
    let sent = false
    try {
      sent = this.sendLive(g, w, owner, entries)
    } finally {
      if (!sent) this.deps.windows.batchAnswered(owner.id) // the request it counted for never went
    }
  }

  /** sendBatch's work: true once the request is on its way (its answer ends it). */
  private sendLive(g: GroupRuntime, w: PartitionState, owner: ConsumerRow, entries: BatchEntry[]): boolean {
    const live: BatchEntry[] = []
    for (const e of entries) {
      if (!w.dropped && w.outstanding.get(e.o.msg.offset) === e.o && e.o.current === e.id) live.push(e)
      else this.giveUp(e, owner) // settled (acked, seeked) or dropped while the batch gathered
    }
    if (live.length === 0) return false
    if (this.deps.stopped() || w.dropped) {
      for (const e of live) this.giveUp(e, owner)
      return false
    }
    live.sort((a, b) => a.o.msg.offset - b.o.msg.offset)
    const nowMs = this.deps.now()
    let request: ReturnType<typeof buildBatchPush>
    try {
      request = buildBatchPush(
        this.targetOf(g, w, owner, nowMs),
        live.map((e) => e.envelope),
        `batch_${live[0]!.id}`,
        nowMs,
        { traceparent: live[0]!.traceparent, tracestate: live[0]!.o.msg.tracestate },
      )
    } catch (err) {
      for (const e of live) this.giveUp(e, owner)
      throw err
    }
    this.deps.metrics?.batchSent(g.row.name, live.length)
    sendPush(
      this.deps.agent,
      {
        url: owner.url,
        body: request.body,
        headerLines: request.headerLines,
        timeoutMs: g.row.pushTimeoutMs,
        maxResponseBytes: BATCH_ANSWER_BYTES,
        auth: authOf(this.deps.agent, owner, g.row.name),
      },
      (r) => this.safely(() => this.settleBatch(g, w, owner, live, r)),
    )
    return true
  }

  /**
   * A batch's answer, message by message: a failure of the request fails each; a 2xx fails those
   * its body lists in `failed` and delivers the others. The window sees one signal of congestion
   * for the batch (its first message), not one per message, and grows by each message delivered.
   */
  private settleBatch(g: GroupRuntime, w: PartitionState, owner: ConsumerRow, entries: BatchEntry[], r: PushResult): void {
    this.deps.windows.batchAnswered(owner.id)
    try {
      if (r.kind !== 'delivered') {
        this.deps.metrics?.pushed(g.row.name, r.kind, r.durationMs / 1000, entries.length)
        entries.forEach((e, i) => {
          this.settleOne(g, w, e.o, e.id, owner, r, i > 0 ? 'neutral' : undefined)
        })
        return
      }
      const failed = failedIds(r.body)
      const listed = entries.filter((e) => failed.has(e.id)).length
      this.deps.metrics?.pushed(g.row.name, 'delivered', r.durationMs / 1000, entries.length - listed)
      this.deps.metrics?.failedInBatch(g.row.name, listed)
      const named: PushResult = {
        kind: 'rejected',
        status: r.status,
        durationMs: r.durationMs,
        body: 'listed in "failed" by the batch answer',
      }
      for (const e of entries) this.settleOne(g, w, e.o, e.id, owner, failed.has(e.id) ? named : r)
    } finally {
      // Once for the batch: the slots it freed are filled together, into the next batch.
      this.deps.windows.wake(owner.id)
    }
  }

  /** An attempt that went into a batch and will not be sent: its slot goes back, its ack deadline (if current) retries it. */
  private giveUp(e: BatchEntry, owner: ConsumerRow): void {
    attemptEnded(e.id, { kind: 'not_sent' })
    if (e.o.pushing === e.id) e.o.pushing = undefined
    this.deps.windows.find(owner.id)?.window.release('neutral')
    this.deps.windows.wake(owner.id)
  }

  private targetOf(g: GroupRuntime, w: PartitionState, owner: ConsumerRow, nowMs: number): PushTarget {
    return {
      groupName: g.row.name,
      topicName: g.topic.name,
      topicId: g.topic.id,
      partition: w.partition,
      pushFormat: g.row.pushFormat,
      consumerSecrets: signingSecrets(owner, nowMs),
    }
  }

  private settle(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string, owner: ConsumerRow, r: PushResult): void {
    this.deps.metrics?.pushed(g.row.name, r.kind, r.durationMs / 1000)
    try {
      this.settleOne(g, w, o, id, owner, r)
    } finally {
      // After the attempt is settled, so a retry it scheduled and new messages compete fairly for the room.
      this.deps.windows.wake(owner.id)
    }
  }

  /** One attempt's answer: health, the window's slot, the attempt (the caller counts the call and wakes the consumer). */
  private settleOne(
    g: GroupRuntime,
    w: PartitionState,
    o: Outstanding,
    id: string,
    owner: ConsumerRow,
    r: PushResult,
    signal?: PushSignal,
  ): void {
    attemptEnded(id, r)
    if (r.kind === 'delivered') this.deps.health?.success(owner.id)
    else this.deps.health?.failure(owner.id, errorOf(r, g.row.pushTimeoutMs))
    this.deps.windows.find(owner.id)?.window.release(signal ?? pushSignal(r))
    this.settleAttempt(g, w, o, id, owner, r)
  }

  private settleAttempt(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string, owner: ConsumerRow, r: PushResult): void {
    if (o.pushing === id) o.pushing = undefined
    // A partition being handed over waits for its last push to be answered.
    if (w.releasing && w.onIdle && !anyPushing(w)) queueMicrotask(w.onIdle)
    const nack = o.nackedPush?.id === id ? o.nackedPush : undefined
    if (nack) {
      o.nackedPush = undefined
      if (w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.current === undefined) {
        const why = r.kind === 'delivered' ? undefined : errorOf(r, g.row.pushTimeoutMs)
        this.deps.attempts.update({
          id,
          durationMs: r.durationMs,
          ...(r.kind === 'rejected' ? { statusCode: r.status } : {}),
          ...(why ? { error: why } : {}),
        })
        // 410 Gone disables the consumer whichever way the attempt was settled.
        if (r.kind === 'rejected' && r.status === 410) this.disable(g, owner)
        return this.nacked(g, w, o, why ? `nacked: ${why}` : 'nacked', nack.delayMs, nack.deadLetter)
      }
    }
    const current = w.outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.current === id
    if (r.kind === 'delivered') {
      this.deps.attempts.update({ id, statusCode: r.status, durationMs: r.durationMs })
      if (current && g.row.ackMode === 'auto') this.complete(g, w, o, id)
      return
    }
    const error = errorOf(r, g.row.pushTimeoutMs)
    // Not current: the message was acked (or the partition seeked) while the push was under way;
    // the attempt row keeps the outcome that gave it, with this answer's details.
    this.deps.attempts.update({
      id,
      finishedAtMs: this.deps.now(),
      durationMs: r.durationMs,
      error,
      ...(current ? { outcome: 'failed' as const } : {}),
      ...(r.kind === 'rejected' ? { statusCode: r.status } : {}),
    })
    if (r.kind === 'rejected' && r.status === 410) this.disable(g, owner)
    if (!current) return
    closeAttempt(o, id)
    this.cancel(o)
    this.failed(g, w, o, error, r.kind === 'rejected' ? r.retryAfterMs : undefined)
  }

  /** An auto ack: the 2xx completes the message. */
  private complete(g: GroupRuntime, w: PartitionState, o: Outstanding, id: string): void {
    this.cancel(o)
    setState(w, o, 'completing')
    const req: CompletionRequest = { g, w, offset: o.msg.offset, outcome: 'acked' }
    this.deps.progress.complete(
      req,
      (status) => this.safely(() => this.completed(req, id, status === 'acked' ? 'acked' : undefined)),
      (err: unknown) => {
        this.deps.log.error({ err }, 'recording an auto ack failed; the message will be pushed again')
        this.safely(() => this.completionFailed(req))
      },
    )
  }

  // ---- failures, retries and dead letters ----

  /** A failed attempt: dead-letter after maxDeliveries, else wait out the backoff. */
  failed(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, retryAfterMs?: number, delayMs?: number): void {
    o.lastError = error
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, error)
    const waitMs = delayMs ?? honourRetryAfterMs(nextDelayMs(o.attempts, g.policy), retryAfterMs, g.policy)
    this.wait(g, w, o, 'retry', this.deps.now() + waitMs)
  }

  /** A nacked attempt: dead-lettered at once when asked, else a failed attempt. */
  nacked(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, delayMs: number | undefined, deadLetter: boolean): void {
    if (deadLetter) {
      // Kept as the last error too: a dead letter whose write fails is retried with this text.
      o.lastError = `${error}; dead-lettered by the nack`
      this.deadLetter(g, w, o, o.lastError)
    } else {
      this.failed(g, w, o, error, undefined, delayMs)
    }
  }

  private deadLetter(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string): void {
    setState(w, o, 'completing')
    const req: CompletionRequest = { g, w, offset: o.msg.offset, outcome: 'dead' }
    const dlq = g.row.deadLetterTopic
    const write = async () => {
      if (dlq) {
        const topic = await this.deps.findTopic(dlq)
        if (!topic) throw new Error(`dead-letter topic ${dlq} does not exist`)
        req.deadLetter = deadLetterEntry(g, w, o, topic, error)
      }
      return this.deps.progress.completeAll([req])
    }
    write()
      .then(
        ([status]) => {
          // An ack can win the race with the dead-lettering; then the message is simply acked.
          if (status === 'dead') {
            this.deps.metrics?.deadLettered(g.row.name)
            recordDeadLetter(o.msg, g.topic.name, g.row.name, o.attempts, dlq, error)
          }
          this.completed(req, o.ids.at(-1), status === 'dead' ? 'dead' : undefined)
        },
        (err: unknown) => {
          this.deps.log.error(
            { err, group: g.row.name, partition: w.partition, offset: o.msg.offset },
            'dead-lettering failed; retrying in 5 s',
          )
          // Unless an ack or a seek settled the message meanwhile.
          if (w.dropped || w.outstanding.get(o.msg.offset) !== o || o.state !== 'completing') return
          this.cancel(o)
          this.wait(g, w, o, 'dead_letter_retry', this.deps.now() + 5000)
        },
      )
      .catch((err: unknown) => this.deps.log.error({ err }, 'settling a dead letter failed'))
  }

  // ---- completion ----

  /** After a completion is durable: forget the message, log the outcome, push the next. */
  completed(req: CompletionRequest, deliveryId: string | undefined, outcome: 'acked' | 'dead' | undefined): void {
    if (req.w.dropped) return // moved or seeked: nothing here is ours any more
    const o = req.w.outstanding.get(req.offset)
    const finishedAtMs = this.deps.now()
    if (o) {
      this.cancel(o)
      setState(req.w, o, 'completing')
      this.forget(req.g, req.w, o)
      // Attempts still open end with the message's outcome (a late ack of attempt 1 also
      // settles attempt 2, which was pushed meanwhile).
      for (const id of o.open) {
        this.deps.attempts.update(
          outcome
            ? { id, outcome, finishedAtMs }
            : { id, outcome: 'failed', finishedAtMs, error: 'the message was completed by another attempt' },
        )
      }
    }
    if (deliveryId && outcome && !o?.open.includes(deliveryId)) {
      // The attempt that dead-letters its message has ended already (failed, timed out or nacked):
      // it is marked dead, but keeps when it ended, its status code and its error, which say why.
      this.deps.attempts.update(outcome === 'dead' ? { id: deliveryId, outcome } : { id: deliveryId, outcome, finishedAtMs })
    }
    this.fill(req.g, req.w)
  }

  /** A completion could not be written: the message stays outstanding and is pushed again soon. */
  completionFailed(req: CompletionRequest): void {
    const o = req.w.outstanding.get(req.offset)
    if (req.w.dropped || !o || o.state !== 'completing' || req.w.completed.has(req.offset)) return
    this.wait(req.g, req.w, o, 'retry', this.deps.now() + 1000)
  }

  // ---- deadlines and waits ----

  /** An ack deadline passed or a wait ended (the schedule calls this; it never throws). */
  due(entry: TrackerEntry | Wait): void {
    this.safely(() => {
      const g = this.deps.group(entry.groupId)
      const w = g?.parts.get(entry.partition)
      const o = w?.outstanding.get(entry.offset)
      if (!g || !w || !o) return
      if (entry instanceof Wait) {
        if (o.wait !== entry) return
        o.wait = undefined
        if (entry.kind === 'dead_letter_retry') return this.deadLetter(g, w, o, o.lastError ?? 'dead-lettered')
        if (entry.kind === 'delay' && g.row.ordering !== 'partition') {
          // Due now, and active from here on: wait for a slot if the partition is full.
          setState(w, o, 'parked')
          if (active(w) > g.row.maxInFlight) return setState(w, o, 'ready')
        }
        return this.start(g, w, o)
      }
      if (o.inFlight !== entry) return
      // A retry still being recorded has not gone out: its deadline runs from its push, or its number would be skipped.
      if (w.unsent.has(entry.deliveryId) && !w.releasing) {
        o.inFlight = this.deps.schedule.ackDeadline(
          entry.deliveryId,
          g.row.id,
          w.partition,
          o.msg.offset,
          o.attempts,
          this.deps.now() + g.row.ackTimeoutMs,
        )
        return
      }
      o.inFlight = undefined
      o.current = undefined
      closeAttempt(o, entry.deliveryId)
      this.deps.attempts.update({
        id: entry.deliveryId,
        outcome: 'timed_out',
        finishedAtMs: this.deps.now(),
        error: `no ack within ${g.row.ackTimeoutMs} ms`,
      })
      // Took the push but not the message in time: as much a sign of overload as a slow answer.
      if (o.pushedTo) {
        this.deps.windows.find(o.pushedTo)?.window.shrink()
        this.deps.health?.failure(o.pushedTo, `no ack within ${g.row.ackTimeoutMs} ms`)
      }
      this.failed(g, w, o, `no ack within ${g.row.ackTimeoutMs} ms`)
    })
  }

  /** Puts a message on the schedule: its delay, a retry's backoff, or dead-lettering again. */
  private wait(g: GroupRuntime, w: PartitionState, o: Outstanding, kind: Wait['kind'], atMs: number): void {
    setState(w, o, kind === 'delay' ? 'delayed' : 'retry_wait')
    o.wait = this.deps.schedule.wait(kind, g.row.id, w.partition, o.msg.offset, atMs)
  }

  /** Takes the message off the schedule (its ack deadline or its wait). */
  cancel(o: Outstanding): void {
    if (o.inFlight) this.deps.schedule.cancel(o.inFlight)
    if (o.wait) this.deps.schedule.cancel(o.wait)
    o.current = undefined
    o.inFlight = undefined
    o.wait = undefined
  }

  /** Forgets an outstanding message (its partition moved, its group changed): its open attempts end as failed. */
  abandon(o: Outstanding, reason: string): void {
    this.cancel(o)
    const finishedAtMs = this.deps.now()
    for (const id of o.open) this.deps.attempts.update({ id, outcome: 'failed', finishedAtMs, error: reason })
    o.open = EMPTY
  }

  /**
   * 410 Gone: the consumer gets nothing more until registered again. Disabled in memory at once,
   * so the retry that follows goes to the partition's new consumer, then recorded in the database
   * (the dispatcher keeps a reload that reads the consumers before that write from undoing it).
   */
  private disable(g: GroupRuntime, pushedTo: ConsumerRow): void {
    // The group's consumers as they are now: a reload between the push and its answer (the group
    // changed, a reconciliation) replaced the row the push was made with, and disabling that stale
    // row alone left the consumer enabled for the retry (seen in CI: a second push to a 410 consumer).
    const owner = g.consumers.find((c) => c.id === pushedTo.id) ?? pushedTo
    if (owner.disabledAt !== null) return
    owner.disabledAt = new Date(this.deps.now())
    owner.disabledReason = 'answered 410 Gone'
    this.consumersChanged(g, g.consumers)
    this.deps
      .disableConsumer(g.row.id, owner.id, owner.disabledReason, owner.disabledAt)
      .catch((err: unknown) => this.deps.log.error({ err, consumer: owner.id }, 'recording a disabled consumer failed'))
  }

  /** Runs a step outside any caller that could handle its error: logs instead of crashing. */
  safely(fn: () => void): void {
    try {
      fn()
    } catch (err) {
      this.deps.log.error({ err }, 'dispatcher step failed')
    }
  }
}

function anyPushing(w: PartitionState): boolean {
  for (const o of w.outstanding.values()) if (o.pushing) return true
  return false
}

/** The delivery ids a batch's 2xx answer lists as failed (`{"failed": [...]}`); none for any other body. */
export function failedIds(body: string): Set<string> {
  if (!body.includes('"failed"')) return new Set()
  try {
    const parsed = JSON.parse(body) as { failed?: unknown }
    return new Set(Array.isArray(parsed.failed) ? parsed.failed.filter((x): x is string => typeof x === 'string') : [])
  } catch {
    return new Set()
  }
}

/** What a failed push's answer says, for the attempt log and dead letters. */
export function errorOf(r: Exclude<PushResult, { kind: 'delivered' }>, pushTimeoutMs: number): string {
  return r.kind === 'rejected'
    ? `HTTP ${r.status}${r.body ? `: ${r.body.slice(0, 200)}` : ''}`
    : r.kind === 'timeout'
      ? `no answer within ${pushTimeoutMs} ms`
      : r.error
}

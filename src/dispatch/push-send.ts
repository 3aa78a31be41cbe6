/**
 * Sending pushes and taking their answers: one attempt as its own POST, or gathered with others of
 * its partition into a batch (batches.ts) and sent as one. Each push holds a slot of its consumer's
 * window (consumer-windows.ts) until its answer, which returns it, records the consumer's health
 * and hands the attempt's result to the push flow (`answered`), which settles the attempt.
 *
 * Nothing here changes a partition but through its methods (sending, answered).
 */
import type { ConsumerRow } from '../store/groups.ts'
import type { DispatchMetrics } from '../metrics.ts'
import type { ConsumerWindows } from './consumer-windows.ts'
import { buildBatchPush, buildEnvelope, buildPush, signingSecrets, type BuiltPush, type PushTarget } from './envelope.ts'
import { Batches, type BatchEntry } from './batches.ts'
import { authOf } from './push-auth.ts'
import { attemptEnded, startAttempt } from './tracing.ts'
import type { HealthRecorder } from './health.ts'
import type { GroupRuntime, Outstanding, PartitionState } from './partition-state.ts'
import type { Attempt } from './partition.ts'
import { send as sendPush, type PushAgent, type PushResult } from './pusher.ts'
import { pushSignal, type PushSignal } from './push-window.ts'
import type { Timers } from './schedule.ts'

/** What a request does with its answer, and what it asks before it goes out (see post). */
interface Posting {
  answer(r: PushResult): void
  /** It will not go: its attempts are given up. */
  unsent(): void
  /** Whether it is still worth sending: an attempt of it is still its message's current one. */
  live(): boolean
  /** It was given a connection: its attempts are sent. */
  went(): void
}

/** Bytes of a batch's answer read (a `failed` list of 1000 delivery ids is about 45 KB). */
const BATCH_ANSWER_BYTES = 64 * 1024

/**
 * Whether this process can still prove it owns the partitions it pushes (src/cluster/ownership.ts
 * keeps it). A process stopped or starved past its lease may have lost them to another process
 * that numbers its attempts from what was recorded: a push it made now could repeat or undercut
 * the new owner's attempt numbers, so none goes out until the lease is proven again.
 */
export interface PushLease {
  held(): boolean
  /** Runs `fn` once the lease is proven again, or once it is lost (the partitions dropped first). */
  wait(fn: () => void): void
}

/** Alone on its database (or in a unit test): nothing can take a partition away. */
const ALWAYS: PushLease = { held: () => true, wait: (fn) => fn() }

export interface PushSenderDeps {
  agent: PushAgent
  metrics?: DispatchMetrics
  now(): number
  timers: Timers
  windows: ConsumerWindows
  health?: HealthRecorder
  /** True once the dispatcher is stopping: nothing new goes out. */
  stopped(): boolean
  /** Checked before each request goes out (default: always held). */
  lease?: PushLease
  /** An attempt's push was answered (its slot returned, its consumer's health recorded): settle the attempt. */
  answered(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, consumer: ConsumerRow, r: PushResult): void
  /** Runs a step outside any caller that could handle its error (the push flow's). */
  safely(fn: () => void): void
}

export class PushSender {
  private readonly batches: Batches
  private readonly lease: PushLease

  constructor(private readonly deps: PushSenderDeps) {
    this.lease = deps.lease ?? ALWAYS
    this.batches = new Batches({
      timers: deps.timers,
      send: (g, w, consumer, entries) => deps.safely(() => this.sendBatch(g, w, consumer, entries)),
      opened: (consumer) => deps.windows.batchOpened(consumer.id),
    })
  }

  /** Whether the partition has a batch gathering for `consumer`: one more attempt joins it, no new request. */
  isOpen(w: PartitionState, consumer: ConsumerRow): boolean {
    return this.batches.isOpen(w, consumer)
  }

  /** Sends one push (or adds it to its partition's batch): the attempt is on its way from here, and settle gets its answer. */
  send(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, consumer: ConsumerRow, deadlineMs: number, nowMs: number): void {
    // The attempt's own span in the message's trace (recorded when tracing is on; see tracing.ts).
    const traceparent = startAttempt(o.msg, a.id, a.number, g.topic, g.row.name, w.partition, consumer.url)
    if (g.row.batchMaxMessages !== null) {
      let envelope: string
      try {
        envelope = buildEnvelope(this.targetOf(g, w, consumer, nowMs), o.msg, a.id, a.number, deadlineMs, traceparent)
      } catch (err) {
        attemptEnded(a.id, { kind: 'not_sent' })
        // Counted as made (see below), though nothing went.
        w.went(a)
        this.deps.windows.find(consumer.id)?.window.release('neutral')
        throw err
      }
      w.sending(o, a, consumer.id)
      return this.batches.add(g, w, consumer, { o, a, envelope, traceparent })
    }
    let request: ReturnType<typeof buildPush>
    try {
      request = buildPush(this.targetOf(g, w, consumer, nowMs), o.msg, a.id, a.number, deadlineMs, nowMs, traceparent)
    } catch (err) {
      attemptEnded(a.id, { kind: 'not_sent' })
      // Nothing went out: the slot goes back, and the ack deadline retries the attempt. It counts as
      // made, though: a message whose push cannot be built is dead-lettered after maxDeliveries
      // (an attempt left unsent would have its deadline put off for as long as it is owned).
      w.went(a)
      this.deps.windows.find(consumer.id)?.window.release('neutral')
      throw err
    }
    w.sending(o, a, consumer.id)
    this.post(g, w, consumer, request, undefined, {
      answer: (result) => this.settle(g, w, o, a, consumer, result),
      unsent: () => this.giveUp(w, { o, a }, consumer),
      live: () => w.outstanding.get(o.msg.offset) === o && o.current === a,
      went: () => w.went(a),
    })
  }

  /**
   * The request goes out, when this process can prove it still owns the partition (see PushLease):
   * until then it waits, and when the partition was dropped meanwhile (or its attempts settled) it
   * goes nowhere (`unsent`). Proven twice: here, and again when the HTTP client gives it a
   * connection, since it may have queued there behind the consumer's other requests (more than its
   * connections at once) while the lease lapsed or the process began to stop. Given the
   * connection, its attempts are sent (`went`): they count from then on, whatever follows.
   */
  private post(
    g: GroupRuntime,
    w: PartitionState,
    consumer: ConsumerRow,
    request: BuiltPush,
    maxResponseBytes: number | undefined,
    then: Posting,
  ): void {
    const again = () =>
      this.deps.safely(() =>
        w.dropped || this.deps.stopped() || !then.live() ? then.unsent() : this.post(g, w, consumer, request, maxResponseBytes, then),
      )
    if (!this.lease.held()) {
      this.lease.wait(again)
      return
    }
    const mayStart = () => {
      if (w.dropped || this.deps.stopped() || !this.lease.held() || !then.live()) return false
      then.went()
      return true
    }
    sendPush(
      this.deps.agent,
      {
        url: consumer.url,
        body: request.body,
        headerLines: request.headerLines,
        timeoutMs: g.row.pushTimeoutMs,
        ...(maxResponseBytes === undefined ? {} : { maxResponseBytes }),
        auth: authOf(this.deps.agent, consumer, g.row.name),
        gate: { mayStart, unsent: again },
      },
      (r) => this.deps.safely(() => then.answer(r)),
    )
  }

  /**
   * Sends a batch (see batches.ts): its attempts still current, in offset order, in one POST.
   * Each one keeps its slot in the consumer's window until the answer, like a single push.
   */
  private sendBatch(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, entries: BatchEntry[]): void {
    let sent = false
    try {
      sent = this.sendLive(g, w, consumer, entries)
    } finally {
      if (!sent) this.deps.windows.batchAnswered(consumer.id) // the request it counted for never went
    }
  }

  /** sendBatch's work: true once the request is on its way (its answer ends it). */
  private sendLive(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, entries: BatchEntry[]): boolean {
    const live: BatchEntry[] = []
    for (const e of entries) {
      if (!w.dropped && w.outstanding.get(e.o.msg.offset) === e.o && e.o.current === e.a) live.push(e)
      else this.giveUp(w, e, consumer) // settled (acked, seeked) or dropped while the batch gathered
    }
    if (live.length === 0) return false
    if (this.deps.stopped() || w.dropped) {
      for (const e of live) this.giveUp(w, e, consumer)
      return false
    }
    live.sort((a, b) => a.o.msg.offset - b.o.msg.offset)
    const nowMs = this.deps.now()
    let request: ReturnType<typeof buildBatchPush>
    try {
      request = buildBatchPush(
        this.targetOf(g, w, consumer, nowMs),
        live.map((e) => e.envelope),
        `batch_${live[0]!.a.id}`,
        nowMs,
        { traceparent: live[0]!.traceparent, tracestate: live[0]!.o.msg.tracestate },
      )
    } catch (err) {
      // Counted as made, as a single push that cannot be built (send).
      for (const e of live) {
        w.went(e.a)
        this.giveUp(w, e, consumer)
      }
      throw err
    }
    this.deps.metrics?.batchSent(g.row.name, live.length)
    this.post(g, w, consumer, request, BATCH_ANSWER_BYTES, {
      answer: (r) => this.settleBatch(g, w, consumer, live, r),
      unsent: () => {
        this.deps.windows.batchAnswered(consumer.id)
        for (const e of live) this.giveUp(w, e, consumer)
      },
      // Goes while any of its attempts is still current (the others went with it, as they were built in).
      live: () => live.some((e) => w.outstanding.get(e.o.msg.offset) === e.o && e.o.current === e.a),
      went: () => {
        for (const e of live) w.went(e.a)
      },
    })
    return true
  }

  /**
   * A batch's answer, message by message: a failure of the request fails each; a 2xx fails those
   * its body lists in `failed` and delivers the others. The window sees one signal of congestion
   * for the batch (its first message), not one per message, and grows by each message delivered.
   */
  private settleBatch(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, entries: BatchEntry[], r: PushResult): void {
    this.deps.windows.batchAnswered(consumer.id)
    try {
      if (r.kind !== 'delivered') {
        this.deps.metrics?.pushed(g.row.name, r.kind, r.durationMs / 1000, entries.length)
        entries.forEach((e, i) => {
          this.settleOne(g, w, e.o, e.a, consumer, r, i > 0 ? 'neutral' : undefined)
        })
        return
      }
      const failed = failedIds(r.body)
      const listed = entries.filter((e) => failed.has(e.a.id)).length
      this.deps.metrics?.pushed(g.row.name, 'delivered', r.durationMs / 1000, entries.length - listed)
      this.deps.metrics?.failedInBatch(g.row.name, listed)
      const named: PushResult = {
        kind: 'rejected',
        status: r.status,
        durationMs: r.durationMs,
        body: 'listed in "failed" by the batch answer',
      }
      for (const e of entries) this.settleOne(g, w, e.o, e.a, consumer, failed.has(e.a.id) ? named : r)
    } finally {
      // Once for the batch: the slots it freed are filled together, into the next batch.
      this.deps.windows.wake(consumer.id)
    }
  }

  /**
   * An attempt that will not be sent (a batch gave it up, its partition was dropped or the process
   * stopped while it waited for the lease or a connection, or it was settled meanwhile): its slot
   * goes back. It stays unsent (Partition.unsent): the handover that follows does not count it.
   */
  private giveUp(w: PartitionState, e: Pick<BatchEntry, 'o' | 'a'>, consumer: ConsumerRow): void {
    attemptEnded(e.a.id, { kind: 'not_sent' })
    w.answered(e.a)
    this.deps.windows.find(consumer.id)?.window.release('neutral')
    this.deps.windows.wake(consumer.id)
  }

  private targetOf(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, nowMs: number): PushTarget {
    return {
      groupName: g.row.name,
      topicName: g.topic.name,
      topicId: g.topic.id,
      partition: w.partition,
      pushFormat: g.row.pushFormat,
      consumerSecrets: signingSecrets(consumer, nowMs),
    }
  }

  private settle(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, consumer: ConsumerRow, r: PushResult): void {
    this.deps.metrics?.pushed(g.row.name, r.kind, r.durationMs / 1000)
    try {
      this.settleOne(g, w, o, a, consumer, r)
    } finally {
      // After the attempt is settled, so a retry it scheduled and new messages compete fairly for the room.
      this.deps.windows.wake(consumer.id)
    }
  }

  /** One attempt's answer: health, the window's slot, the attempt (the caller counts the call and wakes the consumer). */
  private settleOne(
    g: GroupRuntime,
    w: PartitionState,
    o: Outstanding,
    a: Attempt,
    consumer: ConsumerRow,
    r: PushResult,
    signal?: PushSignal,
  ): void {
    // A result without a connection (its authentication or URL failed first, or its deadline passed
    // in the client's queue) is the failed attempt it counts as here: counted by a handover too.
    if (!a.sent) w.went(a)
    attemptEnded(a.id, r)
    if (r.kind === 'delivered') this.deps.health?.success(consumer.id)
    else this.deps.health?.failure(consumer.id, errorOf(r, g.row.pushTimeoutMs))
    this.deps.windows.find(consumer.id)?.window.release(signal ?? pushSignal(r))
    this.deps.answered(g, w, o, a, consumer, r)
  }
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

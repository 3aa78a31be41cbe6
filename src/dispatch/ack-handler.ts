/**
 * Acks, nacks and extends of delivery ids, as the dispatcher takes them (verbs as in the HTTP
 * layer; on the schedule they finish, requeue and touch an attempt's ack deadline).
 *
 * A delivery id names its group, partition, offset and attempt (src/store/delivery-id.ts). One
 * issued here is found in memory; one issued before a restart, or by another process, by its
 * partition: when this process does not push that partition (it moved, or is being handed over),
 * the call is refused with 503 and the caller asks again, reaching the owner; otherwise its
 * attempt row says whether it counts (not when it started before the partition's last seek).
 */
import { HookqError } from '../errors.ts'
import { findAttempt } from '../store/deliveries.ts'
import type { Database } from '../store/db.ts'
import { parseDeliveryId } from '../store/delivery-id.ts'
import type { AttemptLog } from './attempt-log.ts'
import type { DeliveryIndex } from './delivery-index.ts'
import type { ProgressWriter } from './progress.ts'
import type { PushFlow } from './push-flow.ts'
import type { Schedule } from './schedule.ts'
import { setState, type CompletionRequest, type CompletionStatus, type GroupRuntime, type PartitionState } from './partition-state.ts'

export type AckStatus = 'acked' | 'nacked' | 'extended' | 'already_completed' | 'unknown'
export type AckResult = { deliveryId: string; status: AckStatus }

export interface AckHandlerDeps {
  db: Database
  attempts: AttemptLog
  deliveries: DeliveryIndex
  progress: ProgressWriter
  flow: PushFlow
  schedule: Schedule
  now(): number
}

export class AckHandler {
  constructor(private readonly deps: AckHandlerDeps) {}

  /** Completes each message; durable when this resolves. */
  async ack(g: GroupRuntime | undefined, deliveryIds: string[]): Promise<AckResult[]> {
    const out: AckResult[] = deliveryIds.map((deliveryId) => ({ deliveryId, status: 'unknown' as AckStatus }))
    if (!g) return out
    const reqs: { i: number; req: CompletionRequest }[] = []
    let moved = false
    for (const [i, id] of deliveryIds.entries()) {
      const loc = await this.locate(g, id)
      if (loc === 'moved') { moved = true; continue }
      if (!loc) { out[i]!.status = this.recentStatus(g, id); continue }
      const { w, offset } = loc
      const o = w.outstanding.get(offset)
      if (o && o.state !== 'completing') this.deps.flow.cancel(o)
      if (o) setState(w, o, 'completing')
      reqs.push({ i, req: { g, w, offset, outcome: 'acked' } })
    }
    let statuses: CompletionStatus[]
    try {
      statuses = await this.completeAll(reqs.map((r) => r.req))
    } catch (err) {
      for (const { req } of reqs) this.deps.flow.completionFailed(req)
      throw err
    }
    for (const [k, { i, req }] of reqs.entries()) {
      const status = statuses[k]!
      if (status === 'moved') { moved = true; continue }
      out[i]!.status = status === 'dead' ? 'acked' : status
      this.deps.flow.completed(req, deliveryIds[i]!, status === 'acked' ? 'acked' : undefined)
    }
    // The others are durable; the caller asks again, and the partition's new owner answers for these.
    if (moved) throw movedError()
    return out
  }

  /** A failed attempt each: pushed again after `delayMs` (else the backoff), or dead-lettered at once. */
  nack(g: GroupRuntime | undefined, deliveryIds: string[], delayMs: number | undefined, deadLetter: boolean): Promise<AckResult[]> {
    return this.each(g, deliveryIds, (g, id, w, offset) => {
      const o = w.outstanding.get(offset)
      // Only the current attempt can be nacked; an older id names an attempt already settled.
      if (!o || o.state !== 'in_flight' || o.current !== id) return 'already_completed'
      this.deps.flow.cancel(o)
      o.open.delete(id)
      this.deps.attempts.update({ id, outcome: 'nacked', finishedAt: new Date(this.deps.now()) })
      // The push's answer is still to come: it says why (the push flow acts on the nack then).
      if (o.pushing === id) o.nackedPush = { id, delayMs, deadLetter }
      else this.deps.flow.nacked(g, w, o, 'nacked', delayMs, deadLetter)
      return 'nacked'
    })
  }

  /** Moves ack deadlines to now + extendMs. */
  extend(g: GroupRuntime | undefined, deliveryIds: string[], extendMs: number): Promise<AckResult[]> {
    return this.each(g, deliveryIds, (g, id, w, offset) => {
      const deadlineMs = this.deps.now() + extendMs
      if (!this.deps.schedule.touch(id, deadlineMs) && !this.deadlineFor(w, offset, g, id, deadlineMs)) return 'already_completed'
      this.deps.attempts.update({ id, ackDeadline: new Date(deadlineMs) })
      return 'extended'
    })
  }

  /**
   * Applies `fn` to each id this group issued, in order; ids it never issued (or from before a
   * seek) are answered `unknown` or, if their message completed lately, `already_completed`.
   * Ids of partitions pushed elsewhere are left to their owner: the call then fails with 503 once
   * the others are applied (the caller asks again; nacks and extends of settled ids change nothing).
   */
  private async each(g: GroupRuntime | undefined, deliveryIds: string[],
    fn: (g: GroupRuntime, id: string, w: PartitionState, offset: number) => AckStatus): Promise<AckResult[]> {
    const out: AckResult[] = []
    let moved = false
    for (const id of deliveryIds) {
      const loc = g ? await this.locate(g, id) : null
      if (loc === 'moved') { moved = true; continue }
      out.push({ deliveryId: id, status: !g || !loc ? this.recentStatus(g, id) : fn(g, id, loc.w, loc.offset) })
    }
    if (moved) throw movedError()
    return out
  }

  /** An attempt in flight without an ack deadline (auto mode) gets one when it is extended. */
  private deadlineFor(w: PartitionState, offset: number, g: GroupRuntime, id: string, deadlineMs: number): boolean {
    const o = w.outstanding.get(offset)
    if (!o || o.state !== 'in_flight' || o.current !== id || o.inFlight) return false
    o.inFlight = this.deps.schedule.ackDeadline(id, g.row.id, w.partition, offset, o.attempts, deadlineMs)
    return true
  }

  /**
   * Where a delivery id points, if this group issued it; `moved` when its partition is not pushed
   * here (another process owns it, or it is being handed over): its owner answers for it.
   */
  private async locate(g: GroupRuntime, id: string): Promise<{ w: PartitionState; offset: number } | null | 'moved'> {
    // Ids in memory are of partitions owned here: dropping a partition forgets its ids.
    const known = this.deps.deliveries.find(id)
    if (known) return known.g !== g ? null : known.w.releasing ? 'moved' : known
    // Not in memory: issued before a restart or by another process, or its message completed already.
    // The id names its partition: one not pushed here is its owner's to answer, whether or not its
    // attempt row is written yet (a first push's row waits for its outcome).
    const key = parseDeliveryId(id)
    if (!key || key.groupId !== g.row.id || key.partition >= g.topic.partitions) return null
    const w = g.parts.get(key.partition)
    if (!w || w.releasing) return 'moved'
    // Its attempt row: still in this process's attempt log (not written yet), or in the table.
    const row = this.deps.attempts.pending(id) ?? await findAttempt(this.deps.db, g.row.id, id)
    if (!row || row.groupId !== g.row.id || row.topicId !== g.topic.id || row.partition !== key.partition) return null
    return row.startedAt.getTime() >= w.seekAtMs ? { w, offset: row.offset } : null
  }

  /** already_completed for an id of a message this group completed recently, else unknown. */
  private recentStatus(g: GroupRuntime | undefined, id: string): AckStatus {
    return this.deps.deliveries.completedRecently(g, id) ? 'already_completed' : 'unknown'
  }

  /** Completes the messages together; their statuses once durable. */
  private completeAll(reqs: CompletionRequest[]): Promise<CompletionStatus[]> {
    if (reqs.length === 0) return Promise.resolve([])
    return new Promise((resolve, reject) => {
      const statuses = new Array<CompletionStatus>(reqs.length)
      let waiting = reqs.length
      let failed = false
      reqs.forEach((req, k) => this.deps.progress.complete(req, (status) => {
        statuses[k] = status
        if (--waiting === 0 && !failed) resolve(statuses)
      }, (err) => {
        if (!failed) { failed = true; reject(err) }
      }))
    })
  }
}

/** An ack for a partition that is moving between processes: the caller tries again (acks are idempotent). */
function movedError(): HookqError {
  return new HookqError('unavailable', 'a partition of these deliveries is moving to another broker process; retry', { retryAfterS: 1 })
}

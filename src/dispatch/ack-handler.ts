/**
 * Acks, nacks and extends of delivery ids, as the dispatcher takes them (verbs as in the HTTP
 * layer; on the schedule they finish and touch an attempt's ack deadline).
 *
 * A delivery id names its group, partition, offset and attempt (src/core/delivery-id.ts). One
 * issued here is found in memory; one issued before a restart, or by another process, by its
 * partition: when this process does not push that partition (it moved, or is being handed over),
 * the call is refused with 503 and the caller asks again, reaching the owner; otherwise its
 * attempt row says whether it counts (not when it started before the partition's last seek).
 */
import { HookqError } from '../core/errors.ts'
import { findAttempts } from '../store/deliveries.ts'
import type { Database } from '../store/db.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'
import type { AttemptLog } from './attempt-log.ts'
import type { ProgressWriter } from './progress.ts'
import type { PushFlow } from './push-flow.ts'
import type { Schedule } from './schedule.ts'
import { recordSettle } from './tracing.ts'
import type { CompletionRequest, CompletionStatus, GroupRuntime, PartitionState } from './partition-state.ts'

export type AckStatus = 'acked' | 'nacked' | 'extended' | 'already_completed' | 'unknown'
export type AckResult = { deliveryId: string; status: AckStatus }

export interface AckHandlerDeps {
  db: Database
  attempts: AttemptLog
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
    const locs = await this.locate(g, deliveryIds)
    for (const [i, loc] of locs.entries()) {
      if (loc === 'moved') {
        moved = true
        continue
      }
      if (!loc) continue
      const { w, offset } = loc
      const o = w.outstanding.get(offset)
      if (o) recordSettle('ack', o.msg, g.topic.name, g.row.name, o.attempts)
      if (o) this.deps.flow.completing(w, o)
      reqs.push({ i, req: { g, w, offset, outcome: 'acked' } })
    }
    let statuses: CompletionStatus[]
    try {
      const writing = this.deps.progress.completeAll(reqs.map((r) => r.req))
      // The acked messages' slots are free: the next ones go out while the acks are written.
      if (g.row.delivery === 'push')
        for (const w of new Set(reqs.map((r) => r.req.w))) this.deps.flow.safely(() => this.deps.flow.fill(g, w))
      statuses = await writing
    } catch (err) {
      for (const { req } of reqs) this.deps.flow.completionFailed(req)
      throw err
    }
    for (const [k, { i, req }] of reqs.entries()) {
      const status = statuses[k]!
      if (status === 'moved') {
        moved = true
        continue
      }
      // Its own request's outcome (acked), or one written before it: a dead letter counts as acked
      // for the caller, and a filtered message had no delivery id to ack.
      out[i]!.status = status === 'dead' || status === 'filtered' ? 'acked' : status
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
      if (o?.state !== 'in_flight' || o.current?.id !== id) return 'already_completed'
      recordSettle('nack', o.msg, g.topic.name, g.row.name, o.attempts)
      this.deps.flow.nack(g, w, o, o.current, delayMs, deadLetter)
      return 'nacked'
    })
  }

  /** Moves ack deadlines to now + extendMs. */
  extend(g: GroupRuntime | undefined, deliveryIds: string[], extendMs: number): Promise<AckResult[]> {
    return this.each(g, deliveryIds, (g, id, w, offset) => {
      const deadlineMs = this.deps.now() + extendMs
      if (!this.deps.schedule.touch(id, deadlineMs) && !this.deadlineFor(w, offset, g, id, deadlineMs)) return 'already_completed'
      this.deps.attempts.update({ id, ackDeadlineMs: deadlineMs })
      return 'extended'
    })
  }

  /**
   * Applies `fn` to each id this group issued, in order; ids it never issued (or from before a
   * seek) are answered `unknown`. Ids of partitions pushed elsewhere are left to their owner: the
   * call then fails with 503 once the others are applied (the caller asks again; nacks and extends
   * of settled ids change nothing).
   */
  private async each(
    g: GroupRuntime | undefined,
    deliveryIds: string[],
    fn: (g: GroupRuntime, id: string, w: PartitionState, offset: number) => AckStatus,
  ): Promise<AckResult[]> {
    const out: AckResult[] = []
    let moved = false
    const locs = g ? await this.locate(g, deliveryIds) : []
    for (const [i, id] of deliveryIds.entries()) {
      const loc = locs[i]
      if (loc === 'moved') {
        moved = true
        continue
      }
      out.push({ deliveryId: id, status: !g || !loc ? 'unknown' : fn(g, id, loc.w, loc.offset) })
    }
    if (moved) throw movedError()
    return out
  }

  /** An attempt in flight without an ack deadline (auto mode) gets one when it is extended. */
  private deadlineFor(w: PartitionState, offset: number, g: GroupRuntime, id: string, deadlineMs: number): boolean {
    const o = w.outstanding.get(offset)
    const a = o?.state === 'in_flight' ? o.current : undefined
    if (!o || !a || a.id !== id || a.deadline) return false
    w.setDeadline(o, a, this.deps.schedule.ackDeadline(id, g.row.id, w.partition, offset, a.number, deadlineMs))
    return true
  }

  /**
   * Where each delivery id points, if this group issued it (null: not, or from before a seek of its
   * partition); `moved` when its partition is not pushed here (another process owns it, or it is
   * being handed over): its owner answers for it.
   *
   * An id of an outstanding message is in memory, with the message its coordinates name. Any other
   * (its message completed, or the id was issued before a restart or by another process) names its
   * partition, and its attempt row says whether it was issued: the row is still in this process's
   * attempt log, or in the table, where the ids of one call are looked up in one statement. A completed message's id thus answers
   * `already_completed` (its offset is below the committed one), however long ago it was pushed.
   */
  private async locate(g: GroupRuntime, ids: string[]): Promise<(Location | null | 'moved')[]> {
    const out: (Location | null | 'moved')[] = new Array(ids.length).fill(null)
    const lookUp: { i: number; w: PartitionState }[] = []
    for (const [i, id] of ids.entries()) {
      const key = parseDeliveryId(id)
      if (!key || key.groupId !== g.row.id || key.partition >= g.topic.partitions) continue
      // One not pushed here is its owner's to answer, whether or not its row is written yet. A
      // partition being handed over is still this process's: its acks are written under its epoch.
      const w = g.parts.get(key.partition)
      if (!w) {
        out[i] = 'moved'
        continue
      }
      // An outstanding message knows the ids issued for it (a partition replaced by a seek starts
      // with none): no index of ids to keep up at every push.
      if (w.issued(key.offset, id)) {
        out[i] = { w, offset: key.offset }
        continue
      }
      const row = this.deps.attempts.pending(id)
      if (row) out[i] = this.counts(g, w, row)
      else lookUp.push({ i, w })
    }
    if (lookUp.length > 0) {
      const rows = await findAttempts(
        this.deps.db.pool,
        g.row.id,
        lookUp.map(({ i }) => ids[i]!),
      )
      for (const { i, w } of lookUp) {
        const row = rows.get(ids[i]!)
        if (row) out[i] = this.counts(g, w, row)
      }
    }
    return out
  }

  /** The message an attempt row names, unless the row is of another partition's life (before a seek). */
  private counts(
    g: GroupRuntime,
    w: PartitionState,
    row: { topicId: number; partition: number; offset: number; startedAtMs: number },
  ): Location | null {
    if (row.topicId !== g.topic.id || row.partition !== w.partition) return null
    return row.startedAtMs >= w.seekAtMs ? { w, offset: row.offset } : null
  }
}

/** The message of a delivery id, on a partition this process pushes. */
interface Location {
  w: PartitionState
  offset: number
}

/** An ack for a partition that is moving between processes: the caller tries again (acks are idempotent). */
function movedError(): HookqError {
  return new HookqError('unavailable', 'a partition of these deliveries is moving to another broker process; retry', { retryAfterS: 1 })
}

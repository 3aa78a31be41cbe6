/**
 * Gives back the reservation of first pushes that a partition cannot make for now: its group was
 * paused, or its consumer went, after its messages were reserved (by an append's own statement,
 * between the append's claim and its hand-over, or by a reservation written just before). Left in
 * place, a crash would make the next owner count an attempt for each message never pushed: it
 * would push attempt 2 first, or dead-letter the message unpushed at maxDeliveries 1.
 *
 * The give-back is the handover's (dispatcher.ts handBack), for a partition this process keeps:
 * the attempt rows of what was pushed are written first, so the next owner counts exactly those,
 * then the reservation moves back to the first offset never pushed (Partition.firstUnpushed),
 * fenced by the owner epoch. While it runs the partition holds its reservation slot
 * (beginReservation), so no reservation of its own lands after the give-back and is undone by
 * it; appends reserve nothing on a paused partition or one without a consumer (push-flow.ts
 * appendIdle), and one under way is waited for. Once the group is resumed (or gets a consumer),
 * its first pushes are reserved again as any others are.
 */
import type { Database } from '../store/db.ts'
import { handBack } from '../store/consumption.ts'
import type { AttemptLog } from './attempt-log.ts'
import type { GroupRuntime, PartitionState } from './partition-state.ts'

/** After a give-back that failed or found rows being written, the partition's next try waits this long. */
const RETRY_MS = 1000

export interface StalledReservationsDeps {
  db: Database
  attempts: AttemptLog
  log: { error(obj: object, msg: string): void }
  now(): number
  /** Whether the partition can push nothing for now (its group paused, no consumer). */
  stalled(g: GroupRuntime, w: PartitionState): boolean
  /** The give-back is over: messages that asked for a reservation meanwhile ask again (push-flow.ts). */
  resume(g: GroupRuntime, w: PartitionState): void
}

export class StalledReservations {
  /** Partitions whose give-back runs at the end of this turn. */
  private readonly due = new Set<PartitionState>()
  /** Partitions whose last give-back did not happen, and when the next may try. */
  private readonly notBefore = new WeakMap<PartitionState, number>()

  constructor(private readonly deps: StalledReservationsDeps) {}

  /** The partition cannot push for now: what it reserved and never pushed is given back (once per turn). */
  check(g: GroupRuntime, w: PartitionState): void {
    if (w.reservedTo <= w.committed || this.due.has(w) || (this.notBefore.get(w) ?? 0) > this.deps.now()) return
    this.due.add(w)
    setImmediate(() => {
      this.due.delete(w)
      void this.giveBack(g, w)
    })
  }

  private idle(g: GroupRuntime, w: PartitionState): boolean {
    return !w.dropped && !w.releasing && w.appendClaims === 0 && this.deps.stalled(g, w)
  }

  private async giveBack(g: GroupRuntime, w: PartitionState): Promise<void> {
    if (w.reserving || !this.idle(g, w) || w.firstUnpushed(true) >= w.reservedTo) return
    w.beginReservation()
    let given = false
    try {
      // Every attempt's row first, in flight or not: the next owner counts the pushes by them.
      await this.deps.attempts.flush(true)
      // An attempt begun meanwhile (its row not written): the next try.
      if (!this.idle(g, w) || this.deps.attempts.unwritten(g.row.id, w.partition)) return
      const from = w.firstUnpushed(true)
      if (from >= w.reservedTo) return
      w.lowerReservation(from)
      await handBack(this.deps.db.pool, [
        { groupId: g.row.id, topicId: g.topic.id, partition: w.partition, ownerEpoch: w.ownerEpoch, unpushedFrom: from, unsent: [] },
      ])
      given = true
    } catch (err) {
      // The database keeps the reservation: a crash may skip an attempt number, never repeat one.
      this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'giving back the reservation of a stalled partition failed')
    } finally {
      if (!given) this.notBefore.set(w, this.deps.now() + RETRY_MS)
      if (!w.dropped) {
        w.endReservation()
        this.deps.resume(g, w)
      }
    }
  }
}

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
 * it; appends reserve nothing on a paused partition or one without a consumer (reservations.ts
 * appendIdle), and one under way is waited for. Once the group is resumed (or gets a consumer),
 * its first pushes are reserved again as any others are.
 */
import type { Database } from '../store/db.ts'
import { handBack } from '../store/consumption.ts'
import type { AttemptLog } from './attempt-log.ts'
import type { GroupRuntime, PartitionState } from './partition-state.ts'
import type { Timers } from './schedule.ts'

/** After a give-back that failed or found rows being written, the next try comes this much later. */
const RETRY_MS = 1000

export interface StalledReservationsDeps {
  db: Database
  attempts: AttemptLog
  log: { error(obj: object, msg: string): void }
  timers: Timers
  /** Whether the partition can push nothing for now (its group paused, no consumer). */
  stalled(g: GroupRuntime, w: PartitionState): boolean
  /** The give-back is over: messages that asked for a reservation meanwhile ask again (reservations.ts reserved). */
  resume(g: GroupRuntime, w: PartitionState): void
}

export class StalledReservations {
  /** Partitions whose give-back runs at the end of this turn. */
  private readonly due = new Set<PartitionState>()
  /** Partitions whose give-back failed or was put off, with the timer of the next try. */
  private readonly retries = new Map<PartitionState, unknown>()
  /**
   * Partitions whose give-back statement failed after the reservation here was lowered: the
   * database may still hold more, and the next try writes it even with nothing left to lower here.
   */
  private readonly owed = new WeakSet<PartitionState>()

  constructor(private readonly deps: StalledReservationsDeps) {}

  /** The partition cannot push for now: what it reserved and never pushed is given back (once per turn). */
  check(g: GroupRuntime, w: PartitionState): void {
    // (Nothing is pushed below the committed offset: a cheap first look.)
    if (!this.owes(w, w.committed) || this.due.has(w) || this.retries.has(w)) return
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
    // (A reservation or an append's claim under way: its end fills the partition, which checks again.)
    if (w.reserving || !this.idle(g, w) || !this.owes(w, this.unpushedFrom(w))) return
    w.beginReservation()
    let again = false
    try {
      // Every attempt's row first, in flight or not: the next owner counts the pushes by them.
      await this.deps.attempts.flush(true)
      if (!this.idle(g, w)) return
      // A row not written (the flush failed, or an attempt began meanwhile): the next try.
      if (this.deps.attempts.unwritten(g.row.id, w.partition)) {
        again = true
        return
      }
      const from = this.unpushedFrom(w)
      if (!this.owes(w, from)) return
      // Lowered here before the database: a message resumed meanwhile asks for a reservation again
      // (it waits for this one's end), rather than going out on one about to be given back. Owed
      // alone (a failed statement tried again) it is lowered already, or below `from`: offsets
      // completed with no reservation (filtered, retention's gaps) can take the committed offset past it.
      if (from < w.reservedTo) w.lowerReservation(from)
      this.owed.add(w)
      await handBack(this.deps.db.pool, [
        { groupId: g.row.id, topicId: g.topic.id, partition: w.partition, ownerEpoch: w.ownerEpoch, unpushedFrom: from, unsent: [] },
      ])
      this.owed.delete(w)
    } catch (err) {
      // The database may keep the reservation (above the one held here, which is reserved again
      // before a push): a crash may then skip an attempt number, never repeat one.
      this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'giving back the reservation of a stalled partition failed')
      again = true
    } finally {
      if (!w.dropped) {
        w.endReservation()
        if (again && this.deps.stalled(g, w)) this.retryLater(g, w)
        this.deps.resume(g, w)
      }
    }
  }

  /** Whether the database may hold a reservation above `from`, where nothing was pushed. */
  private owes(w: PartitionState, from: number): boolean {
    return from < w.reservedTo || this.owed.has(w)
  }

  /** The first offset never pushed, and never below the committed one (acks of messages not read here can pass what was read). */
  private unpushedFrom(w: PartitionState): number {
    return Math.max(w.committed, w.firstUnpushed(true))
  }

  private retryLater(g: GroupRuntime, w: PartitionState): void {
    if (this.retries.has(w)) return
    this.retries.set(
      w,
      this.deps.timers.setTimeout(() => {
        this.retries.delete(w)
        if (!w.dropped) this.check(g, w)
      }, RETRY_MS),
    )
  }
}

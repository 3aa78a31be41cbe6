/**
 * Reservations: how far a partition's first pushes may go (group_offsets.pushed_offset), written
 * before they go so that a crash never lets the next owner push a message as attempt 1 again.
 *
 * - A message past the reservation waits in `reserving` (PushFlow.start) while one statement of the
 *   progress writer covers every message that pass admitted (`reserve`); its end starts them
 *   (`reserved`).
 * - A reservation covers exactly what can go out now: the consumer's window, or the pull callers'
 *   room, less what is already waiting for one (`promisedTo`, `roomBeyondReservations`). A message
 *   reserved and never pushed would count as attempted after a crash.
 * - For a partition idle here, an append reserves its own first messages in its statement
 *   (`appendRoom`, `appendReserved`; src/store/messages.ts AppendReservation): they go out on the
 *   produce's commit with no second one before the push.
 * - What a stalled partition reserved and cannot push goes back in stalled-reservations.ts.
 *
 * PushFlow owns the moves of a message; this file only decides when a reservation is written and
 * how much it covers, and hands the messages back to PushFlow (`start`, `fill`) once it is.
 */
import type { ConsumerRow } from '../store/groups.ts'
import type { ConsumerWindows } from './consumer-windows.ts'
import type { GroupRuntime, Outstanding, PartitionState } from './partition-state.ts'
import type { ProgressWriter } from './progress.ts'
import type { PullDesk } from './pull-desk.ts'
import type { PushLease } from './push-send.ts'
import type { Timers } from './schedule.ts'

export interface ReservationsDeps {
  progress: ProgressWriter
  windows: ConsumerWindows
  pulls: PullDesk
  /** Whether this process still owns what it pushes (push-send.ts PushLease). */
  lease?: PushLease
  log: { error(obj: object, msg: string): void }
  timers: Timers
  /** True once the dispatcher is stopping: nothing new goes out. */
  stopped(): boolean
  /** A write for the partition was refused for its owner epoch: it is not this process's any more. */
  moved(g: GroupRuntime, w: PartitionState): void
  /** Whether a batch for the consumer is gathering on the partition (push-send.ts). */
  isOpen(w: PartitionState, consumer: ConsumerRow): boolean
  /** PushFlow's: admits what may go out now. */
  fill(g: GroupRuntime, w: PartitionState): void
  /** PushFlow's: the next step of a message (here: one whose reservation is written). */
  start(g: GroupRuntime, w: PartitionState, o: Outstanding): void
  /** PushFlow's: runs `fn`, logging what it throws. */
  safely(fn: () => void): void
}

export class Reservations {
  /** Partitions whose reservation is written once the pass admitting their messages ends (reserve). */
  private readonly due = new Set<PartitionState>()

  constructor(private readonly deps: ReservationsDeps) {}

  /**
   * Messages of the consumer's partitions here waiting for a reservation, `o` aside: its window is
   * the consumer's, shared by them. With batch push a batch gathering takes what is ready whatever
   * the window (consumer-windows.ts), so each free slot is counted as a batch of maxMessages.
   */
  promisedTo(g: GroupRuntime, consumerId: string, o?: Outstanding): number {
    let promised = o?.state === 'reserving' ? -1 : 0
    for (const p of g.parts.values()) {
      const waiting = p.awaitingReservation + p.reservingByAppend
      if (waiting > 0 && g.consumerOf[p.partition]?.id === consumerId) promised += waiting
    }
    return promised
  }

  /** What a pull group's callers here can take beyond the messages already waiting for a reservation. */
  roomBeyondReservations(g: GroupRuntime): number {
    let promised = 0
    for (const p of g.parts.values()) promised += p.awaitingReservation + p.reservingByAppend
    return this.deps.pulls.room(g.row.id) - promised
  }

  /** Whether the partition has nothing to do before an append's next messages (appendRoom), the cheap part of it. */
  appendIdle(g: GroupRuntime, w: PartitionState): boolean {
    if (this.deps.stopped() || g.dropped || g.row.paused || g.filter || w.dropped || w.releasing) return false
    if (w.reading || w.reserving || this.due.has(w) || w.buffer.length > 0 || w.ready.length > 0 || w.delayed > 0) return false
    if (w.awaitingReservation > 0 || w.readPos !== w.endHint || w.reservedTo !== w.readPos) return false
    return !this.deps.lease || this.deps.lease.held()
  }

  /**
   * How many of the messages an append is about to add to the partition (`keys`: theirs, in offset
   * order; none delayed) would go out as soon as produce hands them over: the first pushes its own
   * statement may reserve (src/store/messages.ts AppendReservation), which spares them the progress
   * writer's statement, a second commit between produce and push. Only for a partition with nothing
   * else to do first (nothing read and waiting, nothing ready, delayed or being reserved, caught up
   * with the log as far as it knows) and no more than its room, its consumer's window (or the pull
   * callers') and its ordering allow, as a reservation of the progress writer's would be. None for a
   * group with a filter: a message reserved is pushed after a restart whatever the filter says.
   */
  appendRoom(g: GroupRuntime, w: PartitionState, keys: readonly (string | null)[]): number {
    if (!this.appendIdle(g, w)) return 0
    let n = 0
    if (g.row.ordering === 'partition') n = w.outstanding.size === 0 && w.reservingByAppend === 0 ? 1 : 0
    else {
      const limit = g.row.maxInFlight
      const active = w.active() + w.reservingByAppend
      n = Math.min(limit - active, 2 * limit - active - w.completing)
    }
    if (g.row.ordering === 'key') {
      // Another append's claim is pending: its keys are not known here until it hands its messages
      // over, and a key of ours among them would be reserved twice, the second waiting unpushed
      // behind the first (a crash would then count an attempt never made).
      if (w.reservingByAppend > 0) return 0
      const seen = new Set<string>()
      let k = 0
      for (const key of keys) {
        if (k >= n) break
        if (key !== null) {
          if (seen.has(key) || w.keyBusy(key)) break
          seen.add(key)
        }
        k++
      }
      n = k
    } else n = Math.min(n, keys.length)
    if (n <= 0) return 0
    if (g.row.delivery === 'pull') return this.deps.pulls.taker(g.row.id) ? Math.max(0, Math.min(n, this.roomBeyondReservations(g))) : 0
    const consumer = g.consumerOf[w.partition]
    if (!consumer) return 0
    const windows = this.deps.windows
    const win = windows.of(consumer.id)
    if (!windows.hasRoom(win, this.deps.isOpen(w, consumer))) return 0
    const free = windows.free(win)
    const room = (g.row.batchMaxMessages !== null ? Math.max(1, free) * g.row.batchMaxMessages : free) - this.promisedTo(g, consumer.id)
    return Math.max(0, Math.min(n, room))
  }

  /**
   * An append's reservation of `count` first pushes on the partition is done (reservedTo: where it
   * now ends; null: not written). Written, its messages hold their room until they are taken,
   * which is when produce hands them over, later in this turn. After that turn the partition and
   * the other partitions of its consumer fill again: they may have left messages ready for that
   * room (Transport.reservable, the maxInFlight of Partition.hasRoom), and wait for nothing else.
   */
  appendReserved(g: GroupRuntime, w: PartitionState, count: number, reservedTo: number | null): void {
    w.endAppendReservation(count, reservedTo)
    setImmediate(() =>
      this.deps.safely(() => {
        w.appendHandedOver()
        if (w.dropped || g.dropped) return
        this.deps.fill(g, w)
        this.fillSiblings(g, w)
      }),
    )
  }

  /**
   * Records that first pushes of the partition's waiting offsets may be made, then pushes them.
   * Exactly the offsets waiting to go out now: a reservation past them would make a restart count
   * an attempt for messages never pushed (and dead-letter them at maxDeliveries 1). One
   * reservation covers every message that reached it meanwhile, and the progress writer writes
   * those of all partitions together with the completions.
   */
  reserve(g: GroupRuntime, w: PartitionState): void {
    // Begun at the end of the pass (a microtask), not at its first message, so that what the pass
    // admits is reserved in one write: a pull caller's room for 100, or the slots that a batch of
    // completions freed in a push partition. Begun at once, the first message went alone and the
    // rest waited for the next write (a second linger). The progress writer writes at the end of
    // the turn anyway: no wait is added.
    if (w.reserving || this.due.has(w)) return
    this.due.add(w)
    queueMicrotask(() => {
      this.due.delete(w)
      if (!w.dropped) this.deps.safely(() => this.reserveNow(g, w))
    })
  }

  private reserveNow(g: GroupRuntime, w: PartitionState): void {
    if (w.reserving) return
    let last = -1
    for (const o of w.outstanding.values()) if (o.state === 'reserving' && o.msg.offset > last) last = o.msg.offset
    if (last < 0) return
    w.beginReservation()
    const resume = () => {
      if (w.dropped) return
      w.endReservation()
      this.reserved(g, w)
    }
    this.deps.progress.reserve(
      g,
      w,
      last + 1,
      (held) => {
        if (held) this.deps.safely(resume)
        else this.deps.moved(g, w)
        this.deps.safely(() => this.fillSiblings(g, w))
      },
      (err: unknown) => {
        this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reserving pushes failed; retrying in 1 s')
        this.deps.timers.setTimeout(() => this.deps.safely(resume), 1000)
      },
    )
  }

  /** A reservation (or a give-back) of `w` ended: the messages waiting for one ask again, then it fills. */
  reserved(g: GroupRuntime, w: PartitionState): void {
    for (const o of [...w.outstanding.values()]) if (o.state === 'reserving') this.deps.start(g, w, o)
    this.deps.fill(g, w)
  }

  /**
   * A reservation of `w` ended: the other partitions of its consumer with messages left ready for
   * the window's room it held (Transport.reservable) go on. Nothing else wakes them: the window had
   * room when they were left, so they are not among the partitions waiting for a push to end.
   */
  private fillSiblings(g: GroupRuntime, w: PartitionState): void {
    if (g.row.delivery !== 'push') return
    const consumer = g.consumerOf[w.partition]
    for (const p of g.parts.values()) if (p !== w && p.ready.length > 0 && g.consumerOf[p.partition] === consumer) this.deps.fill(g, p)
  }
}

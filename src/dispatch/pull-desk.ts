/**
 * The callers of `POST /v1/groups/{group}/pull` waiting on this process, per group: a queue of
 * Takers. A lease is an attempt like a push's (push-flow.ts `start`, a lease its transport: the
 * same Attempt, ack deadline on the one tracker, attempt row, backoff, maxDeliveries and dead
 * letters); where a push hands its envelope to a consumer's URL, a lease hands it to the first
 * taker with room.
 *
 * No polling: a taker is woken by the push flow handing it a message (a produce's append, a retry
 * falling due, a lease freed by an ack reach `fill` as for push), or by its own timer when waitMs
 * passes. A waiting taker costs its object and one timer, nothing per message or per tick.
 *
 *   waiting   → (a lease handed) answering on the next turn of the event loop, gathering what else
 *               can be leased in the same pass → answered
 *   waiting   → (waitMs passes) answered with what it has (nothing)
 *   waiting   → (the client went away) answered; nothing more is handed to it. A retry's lease
 *               being written when it went (or when its waitMs or limit passed) is given back:
 *               a failed attempt, leasable again at once (PushFlow.unlease).
 *   waiting   → (its group deleted, switched to push, or its topic gone: closeGroup) answered at once
 *               with what it has; the service then answers 404 or 409 for an empty answer.
 *
 * A probe (room 0) is a taker that leases nothing: it waits until a message of the group could be
 * leased here (`leasable`) and is answered `ready`. A gather over several broker processes long-polls
 * with probes first, so that no owner leases what the caller will not take (src/service/acks.ts).
 */
import type { Timers } from './schedule.ts'

/**
 * A pull without waitMs answers once nothing more can be leased at once; should a read or a write
 * it waits for never end (a database that stopped answering), this bounds the wait.
 */
const IMMEDIATE_LIMIT_MS = 2000

/** One pull call waiting here for messages. */
export class Taker {
  /** Envelopes leased to it, in the order they were leased. */
  readonly envelopes: string[] = []
  /** Leases begun for it and not handed yet (a retry's row being written). */
  pending = 0
  done = false
  /** Answering on the next turn: it has at least one message. */
  answering = false
  timer: ReturnType<Timers['setTimeout']> | undefined = undefined
  /** A probe only: a message could be leased here when it was answered. */
  ready = false

  constructor(
    readonly groupId: number,
    /** Messages it may still take. */
    public room: number,
    readonly leaseMs: number,
    /** waitMs 0: answers once nothing more can be leased at once (idle), not on a timer. */
    readonly immediate: boolean,
    readonly resolve: (envelopes: string[]) => void,
    /** Leases nothing; answered `ready` once something could be leased (see above). */
    readonly probe = false,
  ) {}
}

export interface PullDeskDeps {
  timers: Timers
  /** Whether the group's partitions here have work under way that can lease at once (a read, a reservation, a retry's write). */
  busy(groupId: number): boolean
}

export class PullDesk {
  private readonly waiting = new Map<number, Taker[]>()
  /** Takers with waitMs 0 waiting, over all groups: settled() has nothing to do while there are none. */
  private immediates = 0

  constructor(private readonly deps: PullDeskDeps) {}

  /** Callers waiting for the group here. */
  waiters(groupId: number): number {
    return this.waiting.get(groupId)?.length ?? 0
  }

  /** Whether anyone waits for the group here, probes included: then its partitions read ahead. */
  wanted(groupId: number): boolean {
    return this.waiting.has(groupId)
  }

  /**
   * A message of the group could be leased now and no taker has room for it: the probes waiting
   * for the group are answered `ready` (the takers with room would have got it).
   */
  leasable(groupId: number): void {
    const line = this.waiting.get(groupId)
    if (!line) return
    for (const t of [...line]) {
      if (!t.probe) continue
      t.ready = true
      this.answer(t)
    }
  }

  /** The group is gone from here (deleted, switched to push, its topic deleted): its takers are answered now. */
  closeGroup(groupId: number): void {
    for (const t of [...(this.waiting.get(groupId) ?? [])]) this.answer(t)
  }

  /** A new taker, in line after those already waiting; `resolve` gets its answer once. */
  add(t: Taker, waitMs: number): void {
    let line = this.waiting.get(t.groupId)
    if (!line) this.waiting.set(t.groupId, (line = []))
    line.push(t)
    if (t.immediate) this.immediates++
    t.timer = this.deps.timers.setTimeout(() => this.answer(t), t.immediate ? IMMEDIATE_LIMIT_MS : waitMs)
  }

  /** The first taker of the group with room, or undefined: a message that can go waits `ready`. */
  taker(groupId: number): Taker | undefined {
    const line = this.waiting.get(groupId)
    if (!line) return undefined
    for (const t of line) if (t.room > 0 && !t.done) return t
    return undefined
  }

  /** Messages the group's callers waiting here may still take, in all. */
  room(groupId: number): number {
    let n = 0
    for (const t of this.waiting.get(groupId) ?? []) if (!t.done) n += t.room
    return n
  }

  /** A lease begins for `t`: its slot is taken now. */
  take(t: Taker): void {
    t.room--
    t.pending++
  }

  /** The lease's envelope goes to its taker (false: the taker was answered meanwhile; the caller gives the lease back). */
  hand(t: Taker, envelope: string): boolean {
    t.pending--
    if (t.done) return false
    t.envelopes.push(envelope)
    this.soon(t)
    return true
  }

  /** A lease begun for `t` did not happen (its row could not be written, or the message moved on meanwhile). */
  unhand(t: Taker): void {
    t.pending--
    t.room++
    if (!t.done) this.soon(t)
  }

  /**
   * A pass over the group's partitions ended (fill): takers with waitMs 0 answer once nothing more
   * can be leased at once, with what they have.
   */
  settled(groupId: number): void {
    if (this.immediates === 0) return
    const line = this.waiting.get(groupId)
    if (!line) return
    for (const t of line) if (t.immediate && !t.answering) this.soon(t)
  }

  /** The client went away: answered (to nobody), nothing more handed to it. */
  gone(t: Taker): void {
    this.answer(t)
  }

  /** Every taker answered now (the process stops). */
  closeAll(): void {
    for (const line of [...this.waiting.values()]) for (const t of [...line]) this.answer(t)
  }

  /** Answers on the next turn, after the pass handing messages now (it may hand more). */
  private soon(t: Taker): void {
    if (t.answering || t.done) return
    if (t.envelopes.length === 0 && !(t.immediate && !this.deps.busy(t.groupId))) return
    t.answering = true
    setImmediate(() => {
      t.answering = false
      if (t.pending > 0 || t.done) return // a retry's write is under way: hand() calls soon again
      if (t.envelopes.length === 0 && t.immediate && this.deps.busy(t.groupId)) return
      this.answer(t)
    })
  }

  private answer(t: Taker): void {
    if (t.done) return
    t.done = true
    if (t.immediate) this.immediates--
    if (t.timer !== undefined) this.deps.timers.clearTimeout(t.timer)
    const line = this.waiting.get(t.groupId)
    if (line) {
      const i = line.indexOf(t)
      if (i >= 0) line.splice(i, 1)
      if (line.length === 0) this.waiting.delete(t.groupId)
    }
    t.resolve(t.envelopes)
  }
}

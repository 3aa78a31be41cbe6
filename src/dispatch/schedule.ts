/**
 * The dispatcher's deadlines: the ack deadline of each delivery id in flight (the in-flight
 * tracker, by id: extend moves one, an ack finishes one) and the waits of messages (their delay, a
 * retry's backoff, dead-lettering again; waits.ts), with one timer armed for the earliest of all.
 * What falls due goes to `onDue`, at most MAX_DUE_PER_TICK entries a tick so that a burst of
 * deadlines cannot hold the event loop; the rest follow on the next tick.
 *
 * Time comes from `now` and `timers`, injected: a test's clock steps time instead of waiting.
 */
import { InFlightTracker, TrackerEntry } from './tracker.ts'
import { Wait, WaitQueue, type WaitKind } from './waits.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

/** What the schedule needs of timers: node's by default. */
export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown
  clearTimeout(handle: unknown): void
}
export const nodeTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, timerDelayMs(ms)).unref(),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
}

const MAX_DUE_PER_TICK = 10_000

export class Schedule {
  private readonly tracker = new InFlightTracker()
  private readonly waits = new WaitQueue()
  private timer: unknown
  private timerAtMs = Infinity
  private stopped = false

  constructor(
    private readonly now: () => number,
    private readonly timers: Timers,
    /** An ack deadline passed (a TrackerEntry) or a wait ended (a Wait). Must not throw. */
    private readonly onDue: (entry: TrackerEntry | Wait) => void,
  ) {}

  /** The attempt `deliveryId` of the message at (group, partition, offset) waits for its ack until `deadlineMs`. */
  ackDeadline(deliveryId: string, groupId: number, partition: number, offset: number, attempt: number, deadlineMs: number): TrackerEntry {
    const entry = this.tracker.insert(new TrackerEntry({ deliveryId, groupId, partition, offset, attempt, deadlineMs }))
    this.arm()
    return entry
  }

  /** Moves an ack deadline (extend); false when the id has none (its attempt ended). */
  touch(deliveryId: string, deadlineMs: number): boolean {
    if (!this.tracker.touch(deliveryId, deadlineMs)) return false
    this.arm()
    return true
  }

  /** The message at (group, partition, offset) waits until `atMs`. */
  wait(kind: WaitKind, groupId: number, partition: number, offset: number, atMs: number): Wait {
    const wait = this.waits.add(new Wait(kind, groupId, partition, offset, atMs))
    this.arm()
    return wait
  }

  /** Cancels an ack deadline or a wait (nothing happens when it was due or cancelled already). */
  cancel(entry: TrackerEntry | Wait): void {
    if (entry instanceof Wait) this.waits.cancel(entry)
    else this.tracker.finish(entry.deliveryId)
  }

  /** Stops firing (shutdown). */
  stop(): void {
    this.stopped = true
    this.timers.clearTimeout(this.timer)
    this.timer = undefined
  }

  private nextDeadlineMs(): number | undefined {
    const a = this.tracker.nextDeadlineMs()
    const b = this.waits.nextDeadlineMs()
    return a === undefined ? b : b === undefined ? a : Math.min(a, b)
  }

  /** One timer, for the earliest deadline: re-armed only when something earlier comes. */
  private arm(): void {
    const next = this.nextDeadlineMs()
    if (next === undefined || this.stopped) {
      this.timers.clearTimeout(this.timer)
      this.timer = undefined
      this.timerAtMs = Infinity
      return
    }
    if (this.timer !== undefined && next >= this.timerAtMs) return
    this.timers.clearTimeout(this.timer)
    this.timerAtMs = next
    this.timer = this.timers.setTimeout(() => this.fire(), timerDelayMs(next - this.now()))
  }

  private fire(): void {
    this.timer = undefined
    this.timerAtMs = Infinity
    const nowMs = this.now()
    // Both are out of their structures before any is acted on: one failing cannot strand the rest.
    const due = this.tracker.expireDue(nowMs, MAX_DUE_PER_TICK)
    const waits = this.waits.takeDue(nowMs, MAX_DUE_PER_TICK)
    for (const entry of due) this.onDue(entry)
    for (const wait of waits) this.onDue(wait)
    this.arm()
  }
}

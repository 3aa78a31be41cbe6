/**
 * A clock that moves only when the test says so, and timers on it: the `now` and `timers`
 * (src/dispatch/schedule.ts's `Timers`) that the dispatcher, the progress writer and the partition
 * reader take as dependencies. A test reaches a deadline, a backoff or a linger by moving time to
 * exactly that moment, never by sleeping through it.
 */
import type { Timers } from '../../src/dispatch/schedule.ts'

interface Pending {
  id: number
  atMs: number
  fn: () => void
}

export class SteppedClock implements Timers {
  /** The clock's time. A test may set it directly (a statement that "takes" time on the clock). */
  nowMs: number
  private seq = 0
  private readonly waiting = new Map<number, Pending>()

  /**
   * `startMs`: the real time by default, for code that compares the clock with times the database
   * stamped (a message's produce time must not lie ahead of the clock).
   */
  constructor(startMs = Date.now()) {
    this.nowMs = startMs
  }

  now = (): number => this.nowMs

  setTimeout = (fn: () => void, ms: number): unknown => {
    const id = ++this.seq
    this.waiting.set(id, { id, atMs: this.nowMs + ms, fn })
    return id
  }

  clearTimeout = (handle: unknown): void => {
    this.waiting.delete(handle as number)
  }

  /** The timers not yet fired or cleared, earliest first (set first among equals). */
  get pending(): readonly { atMs: number; inMs: number }[] {
    return this.ordered().map((p) => ({ atMs: p.atMs, inMs: p.atMs - this.nowMs }))
  }

  /** Moves time forward by `ms`, firing every timer due on the way at its own moment, in order. */
  advance(ms: number): void {
    const end = this.nowMs + ms
    for (;;) {
      const next = this.ordered()[0]
      if (!next || next.atMs > end) break
      this.fire(next)
    }
    this.nowMs = end
  }

  /** Moves time to the earliest timer and fires it (time never moves back). Throws when none is set. */
  fireNext(): void {
    const next = this.ordered()[0]
    if (!next) throw new Error('no timer is set')
    this.fire(next)
  }

  private fire(p: Pending): void {
    this.waiting.delete(p.id)
    this.nowMs = Math.max(this.nowMs, p.atMs)
    p.fn()
  }

  private ordered(): Pending[] {
    return [...this.waiting.values()].sort((a, b) => a.atMs - b.atMs || a.id - b.id)
  }
}

/**
 * A consumer's rate limit: at most `perSecond` pushes start in any one second, a sliding window
 * (the contract's "over any one second"), not a token bucket, whose full bucket plus its refill
 * would let twice the rate through in the second after a quiet spell.
 *
 * It keeps the start times of the pushes of the last window and lets one more start while fewer
 * than k (the whole part of the rate, at least 1) started in it. For a whole rate the window is one
 * second: exactly `perSecond` in any second. For a rate below one it is longer (0.5: one push
 * every 2 s); for a rate with a fraction above one (2.5) it stays one second with k = 2, the
 * nearest whole count that never exceeds the rate.
 *
 * A pure structure: the caller passes the time.
 */
export class RateLimit {
  /** Start times, oldest first, from `head` on: those of the last window (older ones are dropped as time passes). */
  private starts: number[] = []
  private head = 0
  private k = 1
  private windowMs = 1000
  perSecond = 0

  constructor(perSecond: number) {
    this.setRate(perSecond)
  }

  /** Changes the rate. The pushes already made still count: a new rate does not open a fresh second. */
  setRate(perSecond: number): void {
    this.perSecond = perSecond
    this.k = Math.max(1, Math.floor(perSecond))
    this.windowMs = Math.max(1000, (this.k * 1000) / perSecond)
  }

  /** Milliseconds until one more push may start (0: now). */
  waitMs(nowMs: number): number {
    this.forget(nowMs)
    const n = this.starts.length - this.head
    if (n < this.k) return 0
    return Math.max(0, this.starts[this.starts.length - this.k]! + this.windowMs - nowMs)
  }

  /** A push starts now (callers check `waitMs` first; the limit does not refuse). */
  take(nowMs: number): void {
    this.starts.push(nowMs)
  }

  /** Drops starts older than the window; they can hold nothing back any more. */
  private forget(nowMs: number): void {
    while (this.head < this.starts.length && this.starts[this.head]! <= nowMs - this.windowMs) this.head++
    if (this.head > 1024 && this.head * 2 > this.starts.length) {
      this.starts = this.starts.slice(this.head)
      this.head = 0
    }
  }
}

/**
 * A token bucket: `ratePerS` tokens a second, holding at most `burst`. Pure: the caller passes the
 * time (ms), so it is tested without clocks.
 */
export class TokenBucket {
  private tokens: number
  private last: number

  constructor(
    readonly ratePerS: number,
    readonly burst: number,
    now: number,
  ) {
    if (!(ratePerS > 0) || !(burst >= 1)) throw new RangeError('TokenBucket needs ratePerS > 0 and burst >= 1')
    this.tokens = burst
    this.last = now
  }

  private refill(now: number): void {
    if (now > this.last) {
      this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) / 1000) * this.ratePerS)
      this.last = now
    }
  }

  /** Takes one token: returns 0 when taken, else the ms until one will be there (nothing taken). */
  take(now: number): number {
    this.refill(now)
    if (this.tokens >= 1) {
      this.tokens -= 1
      return 0
    }
    return ((1 - this.tokens) / this.ratePerS) * 1000
  }

  /** Whether the bucket is full at `now` (an idle bucket that can be forgotten). */
  isFull(now: number): boolean {
    this.refill(now)
    return this.tokens >= this.burst
  }
}

/** Percentiles, medians and ratios of the benches' figures. */

/** Nearest-rank percentile of ascending-sorted values; NaN when there are none. */
export function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN
  const rank = Math.ceil((p / 100) * sorted.length)
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!
}

/** The median of the values (the mean of the middle two for an even count); NaN when there are none. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2
}

/** Collects latencies (ms) into a growable Float64Array: no boxing, cheap to sort. */
export class Latencies {
  private buf = new Float64Array(1 << 16)
  private n = 0
  add(ms: number): void {
    if (this.n === this.buf.length) {
      const bigger = new Float64Array(this.buf.length * 2)
      bigger.set(this.buf)
      this.buf = bigger
    }
    this.buf[this.n++] = ms
  }
  /** How many were added. */
  get count(): number {
    return this.n
  }
  summary(): { p50: number; p99: number; max: number } {
    const sorted = this.buf.slice(0, this.n).sort()
    return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), max: sorted[sorted.length - 1] ?? NaN }
  }
}

/** `a / b` as a ratio to print ("0.87x"); "-" when either is missing. */
export function ratio(a: number, b: number): string {
  const r = a / b
  return Number.isFinite(r) ? `${r.toFixed(2)}x` : '-'
}

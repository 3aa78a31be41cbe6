/** Percentiles, medians, ratios and the printed tables of the benches' figures. */

/** Nearest-rank percentile of ascending-sorted values; NaN when there are none. */
export function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN
  const rank = Math.ceil((p / 100) * sorted.length)
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!
}

/** Nearest-rank percentile of unsorted values; NaN when there are none. */
export const quantile = (xs: number[], p: number) => percentile(Float64Array.from(xs).sort(), p)

/** The median of the finite values (the mean of the middle two for an even count); NaN when there are none. */
export function median(xs: number[]): number {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b)
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

export const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '-')
export const fixed = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : '-')
/** Counts by HTTP status, "429:3 503:1". */
export const codes = (m: Record<string, number>) =>
  Object.entries(m)
    .map(([c, n]) => `${c}:${n}`)
    .join(' ')

/** A text table: the first `leftColumns` columns left-aligned, the others right-aligned. */
export function table(head: string[], body: string[][], leftColumns = 1): string {
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i < leftColumns ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n')
}

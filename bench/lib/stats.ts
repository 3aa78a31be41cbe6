/** Percentiles and the result shape the worker processes print for produce.ts. */
import type { CpuWindow } from './proc.ts'

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

/** What a worker measured inside its window (warm-up excluded). */
export interface Measured {
  /** Successful operations: 201 answers for produce, committed rows for the baseline. */
  ok: number
  /** Messages (or rows) in those operations. */
  items: number
  /** Answers other than 201, by status code. */
  non201: Record<string, number>
  /** Socket errors and timeouts (produce) or failed INSERTs (baseline). */
  errors: number
  latencyMs: { p50: number; p99: number; max: number }
  cpu: CpuWindow
}

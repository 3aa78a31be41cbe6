/**
 * How many pushes may be under way to one consumer at once: a window that grows while the
 * consumer keeps up and shrinks when it struggles, like Pub/Sub push's slow start.
 *
 * - It starts small (`initial`), so a new or recovering consumer is not hit by maxInFlight ×
 *   partitions requests at once.
 * - Each push answered in time grows it by one while the window was actually in use, which
 *   doubles it every round trip (slow start); a window that is not the limit does not grow, so
 *   a quiet consumer does not earn a huge window it never proved it can take.
 * - Each congestion signal halves it, down to `min`: 429, 502, 503 or 504, no answer in time, a
 *   network error, or (explicit ack mode) an ack deadline that passed. Other answers say nothing
 *   about load and leave it alone: a 500 is the consumer failing that message (a bug, a bad
 *   payload), and shrinking the window for it would starve a healthy consumer that rejects some
 *   messages; a 4xx or 410 is about the request.
 *
 * A pure data structure: no clock, no I/O. The dispatcher owns one per consumer.
 */

/** What a finished push says about the consumer's load. */
export type PushSignal = 'ok' | 'congested' | 'neutral'

export interface PushWindowOptions {
  /** Concurrent pushes allowed at first (default 8). */
  initial?: number
  /** Never fewer than this (default 1): a struggling consumer still gets one push at a time. */
  min?: number
  /** Never more than this (default 1000). */
  max?: number
}

export class PushWindow {
  /** Pushes now under way. */
  inFlight = 0
  private size: number
  private readonly min: number
  private readonly max: number

  constructor(options: PushWindowOptions = {}) {
    this.min = Math.max(1, options.min ?? 1)
    this.max = Math.max(this.min, options.max ?? 1000)
    this.size = clamp(options.initial ?? 8, this.min, this.max)
  }

  /** The number of pushes allowed at once now. */
  get limit(): number {
    return this.size
  }

  /** Whether one more push may start. */
  hasRoom(): boolean {
    return this.inFlight < this.size
  }

  /** A push starts (callers check `hasRoom` first; the window does not refuse). */
  acquire(): void {
    this.inFlight++
  }

  /** A push ended; the signal grows or shrinks the window. */
  release(signal: PushSignal): void {
    // The window was in use if, counting this push, at least half of it was taken.
    const used = this.inFlight * 2 >= this.size
    this.inFlight = Math.max(0, this.inFlight - 1)
    if (signal === 'ok' && used) this.size = Math.min(this.max, this.size + 1)
    else if (signal === 'congested') this.shrink()
  }

  /** A congestion signal that is not the end of a push (an ack deadline passed). */
  shrink(): void {
    this.size = Math.max(this.min, Math.floor(this.size / 2))
  }
}

function clamp(n: number, lo: number, hi: number): number {
  return Math.min(hi, Math.max(lo, Math.floor(n)))
}

/** Answers that say the consumer (or the proxy in front of it) is overloaded or out of reach. */
const CONGESTION_STATUSES = new Set([429, 502, 503, 504])

/** What a push's result says about the consumer's load. */
export function pushSignal(r: { kind: 'delivered' | 'rejected' | 'timeout' | 'network'; status?: number }): PushSignal {
  if (r.kind === 'delivered') return 'ok'
  if (r.kind === 'rejected') return CONGESTION_STATUSES.has(r.status ?? 0) ? 'congested' : 'neutral'
  return 'congested'
}

/**
 * What may be pushed to each consumer at once, and the partitions waiting for room. A consumer's
 * room is the smallest of three limits:
 *
 *   the push window       adaptive, grows while the consumer keeps up (push-window.ts)
 *   maxConcurrency        the consumer's fixed cap on pushes in flight, if it has one
 *   rateLimitPerSecond    pushes started in any one second (rate-limit.ts), if it has one
 *
 * Partitions that found no room wait here and are handed back to `fill`, longest waiting first,
 * when a push ends or, for the rate, when the next push may start (one timer per consumer).
 *
 * With batch push the window and maxConcurrency decide when a new batch (a request) may start, not
 * how many messages it carries: a message joining a batch that is gathering needs only the rate,
 * so a batch fills to maxMessages from the messages that are ready (with a window of 8 and
 * maxMessages 10 it went out with 8 and waited maxWaitMs for nothing). The window's message count
 * may then pass its size by up to maxMessages - 1; no new batch starts until it is back below.
 *
 * The fixed limits are the consumer's own, over all broker processes: a process that pushes only
 * some of the consumer's partitions gets their share of each limit (see `limit`).
 */
import type { DispatchMetrics, PushWindowStat } from '../metrics.ts'
import type { GroupRuntime, PartitionState } from './partition-state.ts'
import { PushWindow, type PushWindowOptions } from './push-window.ts'
import { RateLimit } from './rate-limit.ts'
import type { Timers } from './schedule.ts'
import { timerDelayMs } from '../core/timer-delay.ts'
import { boundedRate } from '../core/consumer-limits.ts'

/** A consumer's push window, fixed limits and the partitions waiting for room. */
export interface ConsumerWindow {
  window: PushWindow
  /** The cap on pushes in flight here (this process's share of maxConcurrency), if any. */
  cap: number | undefined
  /** This process's share of the rate limit, if any. */
  rate: RateLimit | undefined
  /** A timer is set for the moment the rate lets the next push start. */
  rateTimer: boolean
  /** Its group pushes in batches: the cap counts batch requests in flight (`requests`), not messages. */
  batching: boolean
  /** Batch requests in flight. */
  requests: number
  waiting: Map<PartitionState, GroupRuntime>
  /** Partitions whose batch was gathering when the rate held them: woken first, by the rate alone. */
  joining: Map<PartitionState, GroupRuntime>
  /** The consumer left while pushes to it were under way: the window goes when the last one ends. */
  retired: boolean
}

/** A consumer's fixed limits, as registered (null: none). */
export interface ConsumerLimits {
  rateLimitPerSecond: number | null
  maxConcurrency: number | null
}

export interface ConsumerWindowsDeps {
  options?: PushWindowOptions
  now(): number
  timers: Timers
  /** A partition that waited may push again. */
  fill(g: GroupRuntime, w: PartitionState): void
  metrics?: DispatchMetrics
}

export class ConsumerWindows {
  private readonly windows = new Map<string, ConsumerWindow>()

  constructor(private readonly deps: ConsumerWindowsDeps) {}

  /** The consumer's window, made on first use (and no longer retired: the consumer is back). */
  of(consumerId: string): ConsumerWindow {
    let win = this.windows.get(consumerId)
    if (!win) {
      win = {
        window: new PushWindow(this.deps.options),
        cap: undefined,
        rate: undefined,
        rateTimer: false,
        batching: false,
        requests: 0,
        waiting: new Map(),
        joining: new Map(),
        retired: false,
      }
      this.windows.set(consumerId, win)
    }
    win.retired = false
    return win
  }

  /** The consumer's window if it has one (never made here: a window goes only once nothing is in flight). */
  find(consumerId: string): ConsumerWindow | undefined {
    return this.windows.get(consumerId)
  }

  /**
   * Sets the consumer's fixed limits, scaled to `share` (the fraction of its partitions this
   * process pushes): the rate exactly, the cap rounded up (at least 1), so with one process the
   * limits hold exactly and with several their sums are at most the rate, and the cap plus one less
   * than the number of processes. A rate limit that changes keeps the pushes already made.
   */
  limit(consumerId: string, limits: ConsumerLimits, share: number, batching: boolean): void {
    if (limits.maxConcurrency === null && limits.rateLimitPerSecond === null && !this.windows.has(consumerId)) return
    const win = this.of(consumerId)
    win.batching = batching
    win.cap = limits.maxConcurrency === null ? undefined : Math.max(1, Math.ceil(limits.maxConcurrency * share))
    // A rate stored outside today's range (before it existed, or by hand) is held within it.
    const rate = limits.rateLimitPerSecond === null || share <= 0 ? undefined : boundedRate(limits.rateLimitPerSecond) * share
    if (rate === undefined) win.rate = undefined
    else if (win.rate) win.rate.setRate(rate)
    else win.rate = new RateLimit(rate)
  }

  /**
   * Whether one more push to the consumer may start now. `joining`: the push joins a batch already
   * gathering: no new request, so only the rate can hold it back (see the top of this file).
   */
  hasRoom(win: ConsumerWindow, joining = false): boolean {
    if (!joining) {
      if (!win.window.hasRoom()) return false
      // The contract's cap is on pushes in flight: HTTP requests, which a batch is one of.
      if (win.cap !== undefined && (win.batching ? win.requests : win.window.inFlight) >= win.cap) return false
    }
    // The rate counts messages (the contract's "messages a second"), in a batch too.
    return win.rate === undefined || win.rate.waitMs(this.deps.now()) === 0
  }

  /**
   * How many more pushes (not batched) the window and cap would let start now, the rate aside: a
   * partition reserves first pushes for no more messages than that (push-flow.ts start).
   */
  free(win: ConsumerWindow): number {
    const free = win.window.limit - win.window.inFlight
    return win.cap === undefined ? free : Math.min(free, win.cap - win.window.inFlight)
  }

  /** A push to the consumer starts (callers check `hasRoom` first). */
  started(win: ConsumerWindow): void {
    win.window.acquire()
    win.rate?.take(this.deps.now())
  }

  /** A batch to the consumer started gathering: a request from now until its answer. */
  batchOpened(consumerId: string): void {
    this.of(consumerId).requests++
  }

  /** A batch request to the consumer was answered (or never sent): wakes what its cap held back. */
  batchAnswered(consumerId: string): void {
    const win = this.windows.get(consumerId)
    if (!win) return
    win.requests = Math.max(0, win.requests - 1)
    this.wake(consumerId)
  }

  /**
   * The partition waits for room in the window (once, however often it asks). When the rate is
   * what holds it, a timer wakes the waiting partitions as soon as the next push may start.
   * `joining`: its batch is gathering, so only the rate holds it, and the rate alone wakes it.
   */
  wait(win: ConsumerWindow, consumerId: string, g: GroupRuntime, w: PartitionState, joining = false): void {
    if (joining) win.joining.set(w, g)
    else win.waiting.set(w, g)
    this.armRate(win, consumerId, g)
  }

  /**
   * A push to the consumer ended (or its rate allows another): calls `fill` for the partitions
   * waiting, longest waiting first, while there is room (a partition that fills the window again
   * waits anew, behind the others), and drops a retired window once nothing is in flight to it.
   */
  wake(consumerId: string): void {
    const win = this.windows.get(consumerId)
    if (!win) return
    // First the batches gathering while the window is full: the rate may let them grow before
    // their maxWaitMs (one whose batch left meanwhile waits again, behind the others).
    for (const [w, g] of win.joining) {
      if (!this.hasRoom(win, true)) {
        this.armRate(win, consumerId, g)
        break
      }
      win.joining.delete(w)
      this.deps.fill(g, w)
    }
    for (const [w, g] of win.waiting) {
      if (!this.hasRoom(win)) {
        // Held by the rate now, not by the pushes under way: their ends would not wake these.
        this.armRate(win, consumerId, g)
        break
      }
      win.waiting.delete(w)
      this.deps.fill(g, w)
    }
    if (win.retired && win.window.inFlight === 0) this.windows.delete(consumerId)
  }

  /** Sets the rate's timer, unless it is set or the rate does not hold the consumer back now. */
  private armRate(win: ConsumerWindow, consumerId: string, g: GroupRuntime): void {
    if (win.rateTimer || win.rate === undefined) return
    const ms = win.rate.waitMs(this.deps.now())
    if (ms === 0) return
    win.rateTimer = true
    this.deps.metrics?.rateLimited(g.row.name)
    this.deps.timers.setTimeout(() => {
      win.rateTimer = false
      this.wake(consumerId)
    }, timerDelayMs(ms))
  }

  /** A consumer left: its window goes now, or when the last push to it ends. */
  forget(consumerId: string): void {
    const win = this.windows.get(consumerId)
    if (!win) return
    if (win.window.inFlight === 0) this.windows.delete(consumerId)
    else win.retired = true
  }

  /** Each consumer's window, for the metrics. */
  stats(): PushWindowStat[] {
    return [...this.windows].map(([consumerId, { window }]) => ({ consumerId, limit: window.limit, inFlight: window.inFlight }))
  }
}

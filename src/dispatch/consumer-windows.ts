/**
 * The push windows of the consumers a dispatcher pushes to (see push-window.ts), and the
 * partitions waiting for room in each, served in the order they started waiting. A pure
 * structure: what to do when a window has room is the caller's (`wake` hands the partitions back).
 */
import type { PushWindowStat } from '../metrics.ts'
import type { GroupRuntime, PartitionState } from './partition-state.ts'
import { PushWindow, type PushWindowOptions } from './push-window.ts'

/** A consumer's push window and the partitions waiting for room in it. */
export interface ConsumerWindow {
  window: PushWindow
  waiting: Map<PartitionState, GroupRuntime>
  /** The consumer left while pushes to it were under way: the window goes when the last one ends. */
  retired: boolean
}

export class ConsumerWindows {
  private readonly windows = new Map<string, ConsumerWindow>()

  constructor(private readonly options?: PushWindowOptions) {}

  /** The consumer's window, made on first use (and no longer retired: the consumer is back). */
  of(consumerId: string): ConsumerWindow {
    let win = this.windows.get(consumerId)
    if (!win) {
      win = { window: new PushWindow(this.options), waiting: new Map(), retired: false }
      this.windows.set(consumerId, win)
    }
    win.retired = false
    return win
  }

  /** The consumer's window if it has one (never made here: a window goes only once nothing is in flight). */
  find(consumerId: string): ConsumerWindow | undefined {
    return this.windows.get(consumerId)
  }

  /** The partition waits for room in the window (once, however often it asks). */
  wait(win: ConsumerWindow, g: GroupRuntime, w: PartitionState): void {
    win.waiting.set(w, g)
  }

  /**
   * A push to the consumer ended: calls `fill` for the partitions waiting, longest waiting first,
   * while there is room (a partition that fills the window again waits anew, behind the others),
   * and drops a retired window once nothing is in flight to it.
   */
  wake(consumerId: string, fill: (g: GroupRuntime, w: PartitionState) => void): void {
    const win = this.windows.get(consumerId)
    if (!win) return
    for (const [w, g] of win.waiting) {
      if (!win.window.hasRoom()) break
      win.waiting.delete(w)
      fill(g, w)
    }
    if (win.retired && win.window.inFlight === 0) this.windows.delete(consumerId)
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

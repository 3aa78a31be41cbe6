/**
 * Retention: messages older than their topic's retentionMs are deleted, in slices, by a loop that
 * wakes every `intervalMs`. Offsets are never reused: a partition's end offset stays where it is,
 * and a read from an offset that has been deleted starts at the oldest one kept (like Kafka's log
 * start offset).
 *
 * States: idle (sleeping) → sweeping → idle …; stop() ends the loop after the current slice.
 * One failed sweep (database away) is logged and retried at the next interval: the loop never dies.
 */
import type { Database } from '../store/db.ts'
import { deleteExpired } from '../store/messages.ts'
import { listTopics } from '../store/topics.ts'
import { timerDelayMs } from '../timer-delay.ts'

export interface RetentionOptions {
  intervalMs: number
  /** Rows deleted per statement. */
  sliceRows: number
  onError(err: unknown): void
  onDeleted?(topic: string, rows: number): void
}

export class RetentionSweeper {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<void> | undefined
  private stopped = false

  constructor(
    private readonly db: Database,
    private readonly opts: RetentionOptions,
  ) {}

  start(): void {
    this.schedule()
  }

  /** Runs one full sweep now (also used by tests). */
  async sweep(): Promise<number> {
    let total = 0
    for (const topic of await listTopics(this.db.prisma)) {
      for (;;) {
        if (this.stopped) return total
        const n = await deleteExpired(this.db.pool, topic.id, topic.retentionMs, this.opts.sliceRows)
        total += n
        if (n > 0) this.opts.onDeleted?.(topic.name, n)
        if (n < this.opts.sliceRows) break
      }
    }
    return total
  }

  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    await this.running
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      this.running = this.sweep()
        .then(
          () => {},
          (err: unknown) => this.opts.onError(err),
        )
        .finally(() => {
          this.running = undefined
          this.schedule()
        })
    }, timerDelayMs(this.opts.intervalMs))
    this.timer.unref()
  }
}

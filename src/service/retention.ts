/**
 * Retention: messages older than their topic's retentionMs, and push attempts older than
 * `attemptRetentionMs`, are deleted, in slices, by a loop that wakes every `intervalMs`. Offsets
 * are never reused: a partition's end offset stays where it is, and a read from an offset that has
 * been deleted starts at the oldest one kept (like Kafka's log start offset). An expired attempt
 * goes once no attempt count needs it (see deleteExpiredAttempts): the newest attempt of a message
 * still in progress stays, so its next push has the next number and maxDeliveries still holds.
 * Consumer health buckets past their window go too (the writes that add to a consumer's buckets
 * delete its old ones, but a consumer no longer pushed to writes nothing).
 *
 * Every broker process sweeps: two sweeps at once delete each row once (the message slices wait
 * on each other's row locks and then find the rows gone; the attempt slices skip rows another holds).
 *
 * States: idle (sleeping) → sweeping → idle …; stop() ends the loop after the current slice.
 * One failed sweep (database away) is logged and retried at the next interval: the loop never dies.
 */
import type { Database } from '../store/db.ts'
import { deleteExpiredHealth } from '../store/consumer-health.ts'
import { deleteExpiredAttempts } from '../store/deliveries.ts'
import { listGroups } from '../store/groups.ts'
import { deleteExpired } from '../store/messages.ts'
import { listTopics } from '../store/topics.ts'
import { timerDelayMs } from '../timer-delay.ts'

export interface RetentionOptions {
  intervalMs: number
  /** How long an attempt stays in the attempt log, ms. */
  attemptRetentionMs: number
  /** Rows deleted per statement. */
  sliceRows: number
  onError(err: unknown): void
  onDeleted?(topic: string, rows: number): void
  onAttemptsDeleted?(group: string, rows: number): void
}

/** What one sweep deleted. */
export interface SweepResult {
  messages: number
  attempts: number
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

  /**
   * Runs one full sweep now (also used by tests). `nowMs` places the attempts' cutoff (a test's
   * later clock makes fresh attempts old); messages are judged by the database's clock.
   */
  async sweep(nowMs = Date.now()): Promise<SweepResult> {
    const done: SweepResult = { messages: 0, attempts: 0 }
    for (const topic of await listTopics(this.db.prisma)) {
      for (;;) {
        if (this.stopped) return done
        const n = await deleteExpired(this.db.pool, topic.id, topic.retentionMs, this.opts.sliceRows)
        done.messages += n
        if (n > 0) this.opts.onDeleted?.(topic.name, n)
        if (n < this.opts.sliceRows) break
      }
    }
    const cutoffMs = nowMs - this.opts.attemptRetentionMs
    for (const group of await listGroups(this.db.prisma)) {
      const n = await this.sweepAttempts(group.id, cutoffMs)
      done.attempts += n
      if (n > 0) this.opts.onAttemptsDeleted?.(group.name, n)
      if (this.stopped) return done
    }
    if (!this.stopped) await deleteExpiredHealth(this.db.pool)
    return done
  }

  /**
   * One group's expired attempts, a slice at a time from the oldest. Rows kept (a message still in
   * progress) are not looked at again in this sweep: each slice either deletes rows or moves `from`
   * past the ones it looked at, so the loop ends however many are kept.
   */
  private async sweepAttempts(groupId: number, cutoffMs: number): Promise<number> {
    let deleted = 0
    let fromMs = 0
    while (!this.stopped) {
      const slice = await deleteExpiredAttempts(this.db.pool, groupId, cutoffMs, fromMs, this.opts.sliceRows)
      deleted += slice.deleted
      if (slice.scanned < this.opts.sliceRows || slice.lastStartedMs === null) break
      // Rows deleted are gone from the next slice; rows kept at the last millisecond would come back,
      // so with nothing deleted the next slice starts after it (its other rows wait for the next sweep).
      fromMs = slice.deleted > 0 ? slice.lastStartedMs : slice.lastStartedMs + 1
    }
    return deleted
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

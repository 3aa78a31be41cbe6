/**
 * Retention, by a loop that wakes every `intervalMs`: messages go whole chunks at a time, a chunk
 * being one topic's messages of a span of time, once its end is older than the topic's retentionMs
 * (src/store/message-chunks.ts, which also makes the chunks ahead, one short transaction per topic).
 * Offsets are never reused: a partition's end offset stays where it is, and a read from an offset
 * that has gone starts at the oldest one kept (like Kafka's log start offset). Push attempts go whole partitions at a time once everything in a
 * partition is older than `attemptRetentionMs` (src/store/attempt-partitions.ts, which also makes
 * the partitions ahead): no row is deleted, so none waits for vacuum. What attempt counts need
 * (the newest attempt of a message still in progress) is carried forward, so its next push has
 * the next number and maxDeliveries still holds. Consumer health buckets past their window go too
 * (the writes that add to a consumer's buckets delete its old ones, but a consumer no longer
 * pushed to writes nothing), idempotency keys past their topic's retention (they no longer
 * deduplicate), and outbox rows set aside longer ago than the attempt retention.
 *
 * Every other table that grows with traffic bounds itself: group_completions lose their rows as the
 * committed offset passes them, produce_outbox its rows as they move, schedule_runners its old spans
 * at each ticker start (docs/performance.md, "What bounds each table").
 *
 * Where autovacuum does not run, the sweeper vacuums messages (rows are deleted there only out of
 * the default partitions and messages_legacy) and idempotency keys itself once enough of them are
 * deleted, and then every table of the schema whose dead rows pass autovacuum's threshold
 * (src/store/vacuum.ts): group_completions above all, whose rows the progress writes delete.
 *
 * Every broker process sweeps: one process at a time maintains a topic's chunks (the others wait
 * for that topic and find nothing left to do), likewise the attempt log's partitions; two sweeps
 * at once delete each idempotency key once (the slices wait on each other's row locks).
 *
 * States: idle (sleeping) → sweeping → idle …; stop() ends the loop after the current slice.
 * One failed sweep (database away) is logged and retried at the next interval: the loop never dies.
 */
import type { Database } from '../store/db.ts'
import { deleteExpiredHealth } from '../store/consumer-health.ts'
import { maintainAttemptPartitions, type MaintenanceResult, type PartitionPlan } from '../store/attempt-partitions.ts'
import { maintainMessageChunks } from '../store/message-chunks.ts'
import { deleteExpiredKeys, type SweptTable, vacuumIfDue } from '../store/messages.ts'
import { deleteExpiredSetAside } from '../store/outbox.ts'
import { listTopics } from '../store/topics.ts'
import { vacuumDeadRows } from '../store/vacuum.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

export interface RetentionOptions {
  intervalMs: number
  /** How long an attempt stays in the attempt log, ms. */
  attemptRetentionMs: number
  /** How the attempt log is partitioned (attemptPartitionPlan). */
  attemptPartitions: PartitionPlan
  /** Idempotency keys deleted per statement. */
  sliceRows: number
  /**
   * Vacuum, as autovacuum would (the server's does not run): the tables the sweep deletes rows from
   * (messages, idempotency keys) after enough deletes, and every table whose dead rows pass
   * autovacuum's threshold once a sweep; the attempt log and the chunks go whole and need none.
   */
  vacuumMessages?: boolean
  onError(err: unknown): void
  onDeleted?(rows: number): void
  /** A topic's chunk maintenance failed (a lock not had in time): tried again at the next sweep. */
  onChunkError?(topicId: number, err: unknown): void
  onAttemptPartitions?(result: MaintenanceResult): void
}

/** What one sweep deleted. */
export interface SweepResult {
  /** Messages gone: with their chunks, or deleted out of a default partition or messages_legacy. */
  messages: number
  /** Chunks of messages dropped. */
  messageChunks: number
  /** Messages moved out of a default partition into the chunks made for them. */
  filedMessages: number
  /** Attempts dropped with their partitions (not those carried forward). */
  attempts: number
  /** Partitions of the attempt log dropped. */
  attemptPartitions: number
  /** Idempotency keys past their topic's retention. */
  idempotencyKeys: number
  /** Outbox rows set aside longer ago than the attempt retention. */
  setAside: number
}

export class RetentionSweeper {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<void> | undefined
  private stopped = false
  /** Rows this process deleted from each table since it last vacuumed it. */
  private readonly deletedSinceVacuum = new Map<SweptTable, number>()

  constructor(
    private readonly db: Database,
    private readonly opts: RetentionOptions,
  ) {}

  start(): void {
    this.schedule()
  }

  /**
   * Runs one full sweep now (also used by tests). `nowMs` places the attempts' cutoff (a test's
   * later clock makes fresh attempts old: partitions are still made by the real clock); messages
   * are judged by the database's clock.
   */
  async sweep(nowMs = Date.now()): Promise<SweepResult> {
    const done: SweepResult = {
      messages: 0,
      messageChunks: 0,
      filedMessages: 0,
      attempts: 0,
      attemptPartitions: 0,
      idempotencyKeys: 0,
      setAside: 0,
    }
    const chunks = await maintainMessageChunks(this.db.pool, {
      sweepIntervalMs: this.opts.intervalMs,
      // Another process maintaining a topic is waited for (a moment), then this one finds nothing left to do.
      wait: true,
      stopped: () => this.stopped,
    })
    for (const f of chunks.failed) this.opts.onChunkError?.(f.topicId, f.err)
    done.messages = chunks.droppedRows + chunks.strayRows + chunks.legacyRows
    done.messageChunks = chunks.dropped.length
    done.filedMessages = chunks.filedRows
    if (done.messages > 0) this.opts.onDeleted?.(done.messages)
    for (const topic of await listTopics(this.db.prisma)) {
      for (;;) {
        if (this.stopped) return done
        const n = await deleteExpiredKeys(this.db.pool, topic.id, topic.retentionMs, this.opts.sliceRows)
        done.idempotencyKeys += n
        // A short slice is not the end when another process sweeps at once: its slice took some of
        // the rows this one had chosen (they were gone once their locks were let go). Only an
        // empty slice is (one index probe more per topic and sweep).
        if (n === 0) break
      }
    }
    await this.vacuumIfDue('messages', chunks.strayRows + chunks.filedRows + chunks.legacyRows)
    await this.vacuumIfDue('idempotency_keys', done.idempotencyKeys)
    const kept = await maintainAttemptPartitions(this.db.pool, {
      nowMs: Date.now(),
      cutoffMs: nowMs - this.opts.attemptRetentionMs,
      plan: this.opts.attemptPartitions,
      // Another process maintaining is waited for (a moment), then this one finds nothing left to do.
      wait: true,
    })
    done.attempts = kept.droppedRows - kept.keptRows
    done.attemptPartitions = kept.dropped.length
    if (kept.created.length > 0 || kept.dropped.length > 0) this.opts.onAttemptPartitions?.(kept)
    if (!this.stopped) await deleteExpiredHealth(this.db.pool)
    if (!this.stopped) done.setAside = await deleteExpiredSetAside(this.db.pool, this.opts.attemptRetentionMs)
    // The rows the sweep does not delete itself (completions, health buckets, the outbox…): by
    // their dead-row counts, as autovacuum would, once a sweep.
    if (this.opts.vacuumMessages && !this.stopped) await vacuumDeadRows(this.db.pool)
    return done
  }

  /** Vacuums `table` after `deleted` more rows, when enough are deleted and autovacuum does not run. */
  private async vacuumIfDue(table: SweptTable, deleted: number): Promise<void> {
    const since = (this.deletedSinceVacuum.get(table) ?? 0) + deleted
    this.deletedSinceVacuum.set(table, since)
    if (this.opts.vacuumMessages && !this.stopped && (await vacuumIfDue(this.db.pool, table, since))) this.deletedSinceVacuum.set(table, 0)
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

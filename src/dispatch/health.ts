/**
 * Consumer health as the console and the group status show it (contract v1.1: last success, last
 * failure and its error, recent failure rate), gathered here from every push this process settles
 * and written about once a second (src/store/consumer-health.ts), a row per consumer and bucket:
 * not a row per push, which the attempt log already is and which would cost a scan of a
 * consumer's recent attempts on every status read.
 *
 * A success is a push answered 2xx. A failure is a push answered otherwise (non-2xx, no answer in
 * time, a network error) or, in explicit mode, an ack deadline that passed. A nack is the
 * consumer's own answer about a message it received, so it is not counted either way.
 */
import { HEALTH_BUCKET_MS, recordHealth, type HealthCounts } from '../store/consumer-health.ts'
import type { Database } from '../store/db.ts'
import type { Timers } from './schedule.ts'

/** How often the counts are written. */
const FLUSH_MS = 1000

export interface HealthRecorderDeps {
  db: Database
  now(): number
  timers: Timers
  log: { warn(obj: object, msg: string): void }
  /** Tests replace the write. */
  write?: (db: Database, rows: HealthCounts[]) => Promise<void>
}

export class HealthRecorder {
  /** Counts since the last write, by consumer and bucket. */
  private pending = new Map<string, HealthCounts>()
  private timer = false
  private writing: Promise<void> | undefined
  private closed = false

  constructor(private readonly deps: HealthRecorderDeps) {}

  /** A push to the consumer succeeded. */
  success(consumerId: string): void {
    const c = this.counts(consumerId)
    c.successes++
    c.lastSuccessAt = new Date(this.deps.now())
  }

  /** A push to the consumer failed (or its ack deadline passed), with the error the attempt log records. */
  failure(consumerId: string, error: string): void {
    const c = this.counts(consumerId)
    c.failures++
    c.lastFailureAt = new Date(this.deps.now())
    c.lastError = error.slice(0, 1000)
  }

  /** Writes what is pending (at shutdown, and in tests). */
  async flush(): Promise<void> {
    while (this.writing) await this.writing
    if (this.pending.size === 0) return
    const rows = [...this.pending.values()]
    this.pending = new Map()
    this.writing = (this.deps.write ?? recordHealth)(this.deps.db, rows)
      .catch((err: unknown) => this.deps.log.warn({ err }, 'writing consumer health failed; those counts are lost'))
      .finally(() => { this.writing = undefined })
    await this.writing
  }

  async close(): Promise<void> {
    this.closed = true
    await this.flush()
  }

  private counts(consumerId: string): HealthCounts {
    const bucketMs = Math.floor(this.deps.now() / HEALTH_BUCKET_MS) * HEALTH_BUCKET_MS
    const key = `${consumerId}\u0000${bucketMs}`
    let c = this.pending.get(key)
    if (!c) {
      c = { consumerId, bucketMs, successes: 0, failures: 0, lastSuccessAt: null, lastFailureAt: null, lastError: null }
      this.pending.set(key, c)
    }
    if (!this.timer && !this.closed) {
      this.timer = true
      this.deps.timers.setTimeout(() => {
        this.timer = false
        void this.flush()
      }, FLUSH_MS)
    }
    return c
  }
}

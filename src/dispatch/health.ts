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
 *
 * On the push path a success costs a map lookup and two number writes: times stay epoch ms until
 * they are written, and a consumer's counts of the current bucket are found by its id alone.
 */
import { HEALTH_BUCKET_MS, recordHealth, type HealthCounts } from '../store/consumer-health.ts'
import type { Database, Queryable } from '../store/db.ts'
import type { Timers } from './schedule.ts'

/** How often the counts are written. */
const FLUSH_MS = 1000

export interface HealthRecorderDeps {
  db: Database
  now(): number
  timers: Timers
  log: { warn(obj: object, msg: string): void }
  /** Tests replace the write. */
  write?: (q: Queryable, rows: HealthCounts[]) => Promise<void>
}

/** One consumer's counts in one bucket, times as epoch ms (0: none). */
interface Counts {
  consumerId: string
  bucketMs: number
  successes: number
  failures: number
  lastSuccessMs: number
  lastFailureMs: number
  lastError: string | null
}

export class HealthRecorder {
  /** Each consumer's counts of its latest bucket since the last write. */
  private current = new Map<string, Counts>()
  /** Counts of buckets that ended before the next write. */
  private ended: Counts[] = []
  private timer = false
  private writing: Promise<void> | undefined
  private closed = false

  constructor(private readonly deps: HealthRecorderDeps) {}

  /** A push to the consumer succeeded. */
  success(consumerId: string): void {
    const nowMs = this.deps.now()
    const c = this.counts(consumerId, nowMs)
    c.successes++
    c.lastSuccessMs = nowMs
  }

  /** A push to the consumer failed (or its ack deadline passed), with the error the attempt log records. */
  failure(consumerId: string, error: string): void {
    const nowMs = this.deps.now()
    const c = this.counts(consumerId, nowMs)
    c.failures++
    c.lastFailureMs = nowMs
    c.lastError = error.slice(0, 1000)
  }

  /** Writes what is pending (at shutdown, and in tests). */
  async flush(): Promise<void> {
    while (this.writing) await this.writing
    if (this.current.size === 0 && this.ended.length === 0) return
    const rows = [...this.ended, ...this.current.values()].map(row)
    this.current = new Map()
    this.ended = []
    this.writing = this.writeApart(rows)
      .catch((err: unknown) => this.deps.log.warn({ err }, 'writing consumer health failed; those counts are lost'))
      .finally(() => {
        this.writing = undefined
      })
    await this.writing
  }

  async close(): Promise<void> {
    this.closed = true
    await this.flush()
  }

  /**
   * Writes the rows; when PostgreSQL refuses them for their data (SQLSTATE class 22), writes each
   * alone, so one consumer's row cannot lose every other's counts, and the refused one again
   * without its error text (its counts still count), or drops it if even that is refused.
   */
  private async writeApart(rows: HealthCounts[]): Promise<void> {
    const write = this.deps.write ?? recordHealth
    try {
      await write(this.deps.db.pool, rows)
    } catch (err) {
      if (!isDataError(err)) throw err
      for (const r of rows) {
        try {
          await write(this.deps.db.pool, [r])
        } catch (alone) {
          if (!isDataError(alone)) throw alone
          this.deps.log.warn({ err: alone, consumerId: r.consumerId }, "a consumer's health row was refused; written without its error")
          await write(this.deps.db.pool, [{ ...r, lastError: r.lastError === null ? null : 'error text not storable' }]).catch(
            (again: unknown) => {
              if (!isDataError(again)) throw again
            },
          )
        }
      }
    }
  }

  private counts(consumerId: string, nowMs: number): Counts {
    const bucketMs = nowMs - (nowMs % HEALTH_BUCKET_MS)
    let c = this.current.get(consumerId)
    if (!c || c.bucketMs !== bucketMs) {
      if (c) this.ended.push(c)
      c = { consumerId, bucketMs, successes: 0, failures: 0, lastSuccessMs: 0, lastFailureMs: 0, lastError: null }
      this.current.set(consumerId, c)
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

function row(c: Counts): HealthCounts {
  return {
    consumerId: c.consumerId,
    bucketMs: c.bucketMs,
    successes: c.successes,
    failures: c.failures,
    lastSuccessAt: c.lastSuccessMs ? new Date(c.lastSuccessMs) : null,
    lastFailureAt: c.lastFailureMs ? new Date(c.lastFailureMs) : null,
    lastError: c.lastError,
  }
}

/** SQLSTATE class 22, data exception: the values are at fault, and fail again as they are. */
function isDataError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return typeof code === 'string' && code.startsWith('22')
}

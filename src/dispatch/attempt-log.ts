/**
 * The attempt log writer: push attempts are recorded in batches, so the database sees a few
 * statements per flush instead of two round trips per push. Each attempt is one row, inserted when
 * its push starts and updated as its outcome becomes known. An outcome known before the row's
 * flush (the common case in auto mode: a push answers within the 5 ms flush delay) is merged into
 * the insert, so no UPDATE is needed; a flush writes inserts before updates, so an update never
 * precedes its row.
 *
 * The log is history (the deliveries listing, attempt counts after a restart), not the record of
 * completion, which the completion transaction writes. A failed flush keeps its rows and retries;
 * past `maxBuffered` rows the oldest are dropped with an error, so a long database outage cannot
 * grow memory without bound.
 */
import type { Database } from '../store/db.ts'
import { insertAttempts, updateAttempts, type AttemptStart, type AttemptUpdate } from '../store/deliveries.ts'

export interface AttemptLogOptions {
  /** How long a row may wait for company before a flush, ms. */
  flushDelayMs: number
  maxBuffered: number
  onError(err: unknown, dropped: number): void
}

export class AttemptLog {
  /** Rows not yet written, by id, in insertion order. */
  private inserts = new Map<string, AttemptStart>()
  private updates = new Map<string, AttemptUpdate>()
  private timer: NodeJS.Timeout | undefined
  private flushing: Promise<void> | undefined
  private failures = 0
  private closed = false

  constructor(private readonly db: Database, private readonly opts: AttemptLogOptions) {}

  /** Records the start of an attempt (outcome in_flight). */
  started(row: AttemptStart): void {
    this.inserts.set(row.id, row)
    this.schedule()
  }

  /** Records a change to an attempt; later changes to one id merge over earlier ones. */
  update(change: AttemptUpdate): void {
    const pending = this.inserts.get(change.id)
    if (pending) {
      Object.assign(pending, definedOnly(change))
      return
    }
    const prev = this.updates.get(change.id)
    this.updates.set(change.id, prev ? { ...prev, ...definedOnly(change) } : change)
    this.schedule()
  }

  /** Writes everything buffered now; resolves when it is written (or has failed and been kept). */
  async flush(): Promise<void> {
    clearTimeout(this.timer)
    this.timer = undefined
    while (this.flushing) await this.flushing
    if (this.inserts.size === 0 && this.updates.size === 0) return
    const inserts = this.inserts
    const updates = this.updates
    this.inserts = new Map()
    this.updates = new Map()
    this.flushing = (async () => {
      try {
        await insertAttempts(this.db, [...inserts.values()])
        await updateAttempts(this.db, [...updates.values()])
        this.failures = 0
      } catch (err) {
        // Put them back in front of what arrived meanwhile, and try again later.
        for (const [id, row] of this.inserts) inserts.set(id, row)
        this.inserts = inserts
        for (const [id, u] of this.updates) updates.set(id, { ...(updates.get(id) ?? {}), ...definedOnly(u) } as AttemptUpdate)
        this.updates = updates
        const dropped = this.trim()
        this.failures++
        this.opts.onError(err, dropped)
      } finally {
        this.flushing = undefined
      }
    })()
    await this.flushing
    if (this.failures > 0) this.schedule(Math.min(5_000, 100 * 2 ** this.failures))
  }

  /** Writes what is buffered and stops scheduling flushes (shutdown). */
  async close(): Promise<void> {
    await this.flush()
    this.closed = true
    clearTimeout(this.timer)
  }

  /** Rows waiting to be written. */
  get buffered(): number {
    return this.inserts.size + this.updates.size
  }

  private schedule(delayMs = this.opts.flushDelayMs): void {
    if (this.timer || this.closed) return
    this.timer = setTimeout(() => { this.timer = undefined; void this.flush() }, delayMs)
  }

  private trim(): number {
    let dropped = 0
    for (const id of this.inserts.keys()) {
      if (this.buffered <= this.opts.maxBuffered) break
      this.inserts.delete(id)
      this.updates.delete(id)
      dropped++
    }
    return dropped
  }
}

function definedOnly(u: AttemptUpdate): Partial<AttemptUpdate> {
  const out: Partial<AttemptUpdate> = {}
  for (const [k, v] of Object.entries(u)) if (v !== undefined) (out as Record<string, unknown>)[k] = v
  return out
}

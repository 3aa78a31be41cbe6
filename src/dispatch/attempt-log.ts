/**
 * The attempt log writer: push attempts are recorded in batches, so the database sees a few
 * statements per flush instead of two round trips per push. Each attempt is one row.
 *
 * A row is written once its outcome is known (acked, failed, timed out, nacked, dead), merged with
 * everything learnt about it meanwhile, so the common attempt costs one INSERT and no UPDATE. A
 * row whose outcome takes longer than `holdMs` (a slow consumer, an explicit ack far off) is
 * written as in_flight then, and its outcome later by an UPDATE. A flush writes inserts before
 * updates, so an update never precedes its row.
 *
 * Two kinds of rows do not wait:
 * - `durable(row)`: a retry's row, written before its push goes out. With the first pushes'
 *   reservations (group_offsets.pushed_offset, see push-flow.ts) this is what keeps attempt
 *   numbers strictly increasing per message, and maxDeliveries a bound on pushes, across crashes.
 * - rows of an attempt that has ended: written within `flushDelayMs` (N times it with N processes, capped).
 *
 * The log is history (the deliveries listing, attempt counts after a restart), not the record of
 * completion, which the completion transaction writes. A failed flush keeps its rows and retries;
 * past `maxBuffered` rows the oldest are dropped with an error, so a long database outage cannot
 * grow memory without bound. A flush refused for its data (a value PostgreSQL cannot hold) is not
 * retried as it was, which would fail for ever and hold up every group's rows: it is written in
 * halves until the row at fault is alone, and that row is written without its details.
 */
import type { Database } from '../store/db.ts'
import { insertAttempts, updateAttempts, type AttemptStart, type AttemptUpdate } from '../store/deliveries.ts'
import type { Timers } from './schedule.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

export interface AttemptLogOptions {
  /**
   * How long a row with its outcome known may wait for company before a flush, ms, for a process
   * alone. N processes sharing the pushes wait N times as long (up to maxFlushDelayMs), so that
   * together they write about the statements one process would: each sees a Nth of the rows.
   */
  flushDelayMs: number
  /** The cap on that wait as it grows with the processes, ms; without it, the wait does not grow. */
  maxFlushDelayMs?: number
  /** The broker processes sharing the pushes, this one included (1 when alone or absent). */
  processes?: () => number
  /** How long a row may wait for its outcome before it is written as in_flight, ms. */
  holdMs: number
  maxBuffered: number
  onError(err: unknown, dropped: number): void
  now?: () => number
  /** Timers for the flushes (a test's own, to see when one is due); Node's when absent. */
  timers?: Timers
}

/** Node's timers, kept referenced: rows waiting to be written keep the process alive until then. */
const refTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, timerDelayMs(ms)),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
}

export class AttemptLog {
  /** Rows waiting for their outcome, in the order they started (so the oldest are at the front). */
  private held = new Map<string, AttemptStart>()
  /** Rows to insert at the next flush. */
  private ready = new Map<string, AttemptStart>()
  private updates = new Map<string, AttemptUpdate>()
  /** The rows the flush under way is inserting (each leaves it once written). */
  private inserting: Map<string, AttemptStart> | undefined
  private timer: unknown
  private timerAtMs = Infinity
  private flushing: Promise<void> | undefined
  private failures = 0
  /** Ids of durable() rows not yet settled, and those of them dropped instead of written. */
  private durables = new Set<string>()
  private lostDurables = new Set<string>()
  /**
   * When the rows written in flight started, by id, until their outcome is written: an update's
   * bound on where its rows are filed (filed_at is the start; see updateAttempts). Bounded: an id
   * whose outcome this log never writes (its partition handed over) leaves as the oldest; without
   * its entry, an update is only unbounded, not wrong.
   */
  private startedInFlight = new Map<string, number>()
  private closed = false
  private readonly now: () => number
  private readonly timers: Timers

  constructor(
    private readonly db: Database,
    private readonly opts: AttemptLogOptions,
  ) {
    this.now = opts.now ?? Date.now
    this.timers = opts.timers ?? refTimers
  }

  /** Records the start of an attempt (outcome in_flight until told otherwise). */
  started(row: AttemptStart): void {
    if (row.outcome && row.outcome !== 'in_flight') this.ready.set(row.id, row)
    else this.held.set(row.id, row)
    this.schedule()
  }

  /**
   * Records the start of an attempt and resolves once its row is written. Rejects if it could not
   * be, and then forgets the row: the caller does not make the attempt.
   */
  async durable(row: AttemptStart): Promise<void> {
    this.ready.set(row.id, row)
    this.durables.add(row.id)
    try {
      await this.flush()
    } finally {
      this.durables.delete(row.id)
    }
    // Still waiting (the flush failed), or dropped (trimmed, or refused even without its details).
    const lost = this.lostDurables.delete(row.id)
    if (!lost && !this.ready.has(row.id)) return
    this.ready.delete(row.id)
    this.updates.delete(row.id)
    throw new Error('the attempt could not be recorded')
  }

  /**
   * An attempt's row not written yet (started, ready for the next flush, or in the flush under way
   * and not yet committed), if it is one. While a flush runs its rows are in neither place a reader
   * could find them otherwise: not here, and not yet visible in the table.
   */
  pending(id: string): AttemptStart | undefined {
    return this.held.get(id) ?? this.ready.get(id) ?? this.inserting?.get(id)
  }

  /** Whether a row of the partition is not written yet (a handover's check, so a scan will do). */
  unwritten(groupId: number, partition: number): boolean {
    for (const rows of [this.held, this.ready, this.inserting]) {
      if (!rows) continue
      for (const r of rows.values()) if (r.groupId === groupId && r.partition === partition) return true
    }
    return false
  }

  /**
   * Forgets an attempt whose row is not written yet and will not be (a lease its caller never
   * received: the attempt did not happen). False when it is written or being written.
   */
  forget(id: string): boolean {
    if (this.held.delete(id)) return true
    if (this.durables.has(id) || !this.ready.delete(id)) return false
    this.updates.delete(id)
    return true
  }

  /** Records a change to an attempt; later changes to one id merge over earlier ones. */
  update(change: AttemptUpdate): void {
    const held = this.held.get(change.id)
    if (held) {
      mergeInto(held, change)
      if (change.outcome && change.outcome !== 'in_flight') {
        this.held.delete(change.id)
        this.ready.set(change.id, held)
        this.schedule()
      }
      return
    }
    const pending = this.ready.get(change.id)
    if (pending) {
      mergeInto(pending, change)
      return
    }
    const prev = this.updates.get(change.id)
    this.updates.set(change.id, prev ? { ...prev, ...definedOnly(change) } : change)
    this.schedule()
  }

  /** Writes what is due now (with `all`, rows still waiting for their outcome too); resolves when written or failed and kept. */
  async flush(all = false): Promise<void> {
    this.timers.clearTimeout(this.timer)
    this.timer = undefined
    this.timerAtMs = Infinity
    while (this.flushing) await this.flushing
    this.releaseHeld(all ? Infinity : this.now() - this.opts.holdMs)
    if (this.ready.size === 0 && this.updates.size === 0) return this.schedule()
    const inserts = this.ready
    const updates = this.updates
    this.ready = new Map()
    this.updates = new Map()
    this.inserting = inserts
    this.flushing = (async () => {
      try {
        // What is written leaves the batch as it goes: after a failure part-way, only the rest is
        // put back, so a later outcome of a row already inserted becomes an UPDATE, not a merge
        // into an INSERT that would then do nothing (ON CONFLICT DO NOTHING).
        await this.writeApart(
          [...inserts.values()],
          async (rows) => {
            await insertAttempts(this.db.pool, rows)
            for (const r of rows) {
              inserts.delete(r.id)
              if (!r.outcome || r.outcome === 'in_flight') this.startedInFlight.set(r.id, r.startedAtMs)
            }
            this.forgetOldestStarts()
          },
          withoutDetails,
        )
        await this.writeApart(
          [...updates.values()],
          async (rows) => {
            await updateAttempts(this.db.pool, rows, this.filedFrom(rows))
            for (const r of rows) {
              updates.delete(r.id)
              if (r.outcome && r.outcome !== 'in_flight') this.startedInFlight.delete(r.id)
            }
          },
          (u, err) => ({ id: u.id, outcome: u.outcome, finishedAtMs: u.finishedAtMs, error: notStorable(err) }),
        )
        this.failures = 0
      } catch (err) {
        // Put them back in front of what arrived meanwhile, and try again later.
        for (const [id, row] of this.ready) inserts.set(id, row)
        this.ready = inserts
        for (const [id, u] of this.updates) updates.set(id, { ...(updates.get(id) ?? {}), ...definedOnly(u) } as AttemptUpdate)
        this.updates = updates
        const dropped = this.trim()
        this.failures++
        this.opts.onError(err, dropped)
      } finally {
        this.inserting = undefined
        this.flushing = undefined
      }
    })()
    await this.flushing
    this.schedule(this.failures > 0 ? Math.min(5_000, 100 * 2 ** this.failures) : undefined)
  }

  /** Writes everything buffered, in flight or not, and stops scheduling flushes (shutdown). */
  async close(): Promise<void> {
    await this.flush(true)
    this.closed = true
    this.timers.clearTimeout(this.timer)
  }

  /** Rows waiting to be written. */
  get buffered(): number {
    return this.held.size + this.ready.size + this.updates.size
  }

  private flushDelayMs(): number {
    const n = Math.max(1, this.opts.processes?.() ?? 1)
    return Math.min(this.opts.flushDelayMs * n, this.opts.maxFlushDelayMs ?? this.opts.flushDelayMs)
  }

  /** Moves rows that started before `cutoffMs` from waiting for their outcome to the next flush. */
  private releaseHeld(cutoffMs: number): void {
    for (const [id, row] of this.held) {
      if (row.startedAtMs > cutoffMs) break
      this.held.delete(id)
      this.ready.set(id, row)
    }
  }

  /** Arms the flush timer: soon when something is due, else when the oldest held row's wait ends. */
  private schedule(delayMs?: number): void {
    if (this.closed) return
    let atMs: number
    if (delayMs !== undefined) atMs = this.now() + delayMs
    else if (this.ready.size > 0 || this.updates.size > 0) atMs = this.now() + this.flushDelayMs()
    else {
      const oldest = this.held.values().next()
      if (oldest.done) return
      atMs = oldest.value.startedAtMs + this.opts.holdMs
    }
    if (this.timer && this.timerAtMs <= atMs) return
    this.timers.clearTimeout(this.timer)
    this.timerAtMs = atMs
    this.timer = this.timers.setTimeout(
      () => {
        this.timer = undefined
        this.timerAtMs = Infinity
        void this.flush()
      },
      timerDelayMs(atMs - this.now()),
    )
  }

  /**
   * Writes `rows`; when PostgreSQL refuses the batch for its data, writes it in halves, so the rows
   * around a bad one land, and the bad one, alone, as `plain` makes it (dropped, and reported, if
   * even that is refused). Rows written before another kind of error are written again at the retry:
   * inserts skip what exists and updates set the same values, so that repeats nothing.
   */
  private async writeApart<R extends { id: string }>(
    rows: R[],
    write: (rows: R[]) => Promise<void>,
    plain: (row: R, err: unknown) => R,
  ): Promise<void> {
    if (rows.length === 0) return
    try {
      await write(rows)
    } catch (err) {
      if (!isDataError(err)) throw err
      if (rows.length > 1) {
        const half = rows.length >> 1
        await this.writeApart(rows.slice(0, half), write, plain)
        await this.writeApart(rows.slice(half), write, plain)
        return
      }
      try {
        await write([plain(rows[0]!, err)])
      } catch (again) {
        if (!isDataError(again)) throw again
        this.dropped(rows[0]!.id)
        this.opts.onError(again, 1)
      }
    }
  }

  /** The earliest start of these rows, if this log wrote each of them (else no bound: undefined). */
  private filedFrom(rows: AttemptUpdate[]): number | undefined {
    let from = Infinity
    for (const r of rows) {
      const started = this.startedInFlight.get(r.id)
      if (started === undefined) return undefined
      if (started < from) from = started
    }
    return from
  }

  private forgetOldestStarts(): void {
    for (const id of this.startedInFlight.keys()) {
      if (this.startedInFlight.size <= this.opts.maxBuffered) break
      this.startedInFlight.delete(id)
    }
  }

  /** A row given up: a durable() waiting for it must fail, not take the silence for a write. */
  private dropped(id: string): void {
    if (this.durables.has(id)) this.lostDurables.add(id)
  }

  private trim(): number {
    let dropped = 0
    for (const id of this.ready.keys()) {
      if (this.buffered <= this.opts.maxBuffered) break
      this.ready.delete(id)
      this.updates.delete(id)
      this.dropped(id)
      dropped++
    }
    return dropped
  }
}

/** SQLSTATE class 22, data exception: the values are at fault, not the database; as they are, they fail again. */
function isDataError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return typeof code === 'string' && code.startsWith('22')
}

/** What a row's refused details become: the reason, so the log shows that something was there. */
function notStorable(err: unknown): string {
  return `attempt details not storable: ${(err as Error).message}`
}

/** An attempt row with only what identifies it, its times and its outcome. */
function withoutDetails(row: AttemptStart, err: unknown): AttemptStart {
  return { ...row, statusCode: undefined, durationMs: undefined, error: notStorable(err) }
}

/** Copies the fields of `u` that are set onto a row (or update) not yet written: no object made, this runs per push. */
function mergeInto(row: Omit<AttemptUpdate, 'id'>, u: AttemptUpdate): void {
  if (u.outcome !== undefined) row.outcome = u.outcome
  if (u.finishedAtMs !== undefined) row.finishedAtMs = u.finishedAtMs
  if (u.statusCode !== undefined) row.statusCode = u.statusCode
  if (u.durationMs !== undefined) row.durationMs = u.durationMs
  if (u.error !== undefined) row.error = u.error
  if (u.ackDeadlineMs !== undefined) row.ackDeadlineMs = u.ackDeadlineMs
}

/** The fields of `u` that are set, as an update of their own. */
function definedOnly(u: AttemptUpdate): Partial<AttemptUpdate> {
  const out: Partial<AttemptUpdate> = { id: u.id }
  mergeInto(out, u)
  return out
}

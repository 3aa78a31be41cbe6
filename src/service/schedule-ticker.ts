/**
 * The schedule ticker: makes each schedule's ticks, exactly once each, whatever the number of
 * broker processes and however they die. Every process runs one.
 *
 * Design. The truth is the schedules table: `next_tick_at` is the first tick not yet made. A tick
 * is one transaction (src/store/schedules.ts tickDue): claim the due rows FOR UPDATE SKIP LOCKED,
 * append each tick's message to its topic (HTTP produce's APPEND: a dense offset under the
 * partition's lock), UPDATE next_tick_at and last_tick_at, COMMIT; then wake the dispatchers as
 * produce does. A committed tick is a message in the log, not a row waiting to be moved.
 * - Never two: the message and the move of next_tick_at commit together, and a row is claimed by
 *   one transaction at a time (the others skip it, and re-read it once it is committed).
 * - Never none: a process killed mid-tick leaves a transaction PostgreSQL rolls back (its
 *   connection closes with it) and the row unlocked and still due; every other process's ticker
 *   claims it at its next look (at most HEARTBEAT_MS later), and makes every tick since, however
 *   late, that passed while a broker ran.
 * - "While a broker ran": each process records its span in schedule_runners (started_at, and
 *   alive_at moved on by a heartbeat every HEARTBEAT_MS; stopped_at when it stops cleanly). A
 *   killed process's span is taken to end GRACE_MS after its last heartbeat. A tick inside any span
 *   is made; ticks between spans passed while no broker ran, and follow the schedule's `missed`
 *   (skip: none; once: the latest of them). A process stalled for longer than GRACE_MS while
 *   another one starts looks dead to it: the ticks of the stall count as missed.
 * - Deleting a schedule deletes its row: the DELETE waits for a tick transaction holding it, and no
 *   later one can claim it, so no tick follows the answer.
 * - Wakes: a timer at the earliest next_tick_at of all schedules (read by the heartbeat, on the
 *   database's clock, so hosts' clocks need not agree), a wake() when this process writes a
 *   schedule, and the heartbeat itself every HEARTBEAT_MS: a schedule another process wrote is
 *   seen within that. No polling in between: an idle broker makes one statement a second.
 */
import { randomUUID } from 'node:crypto'
import type { Database } from '../store/db.ts'
import { heartbeat, pruneRunners, stopRunner, tickDue, type DueSchedule, type RunnerSpan, type TickWrite } from '../store/schedules.ts'
import { timerDelayMs } from '../core/timer-delay.ts'
import { messageTrace, type MessageTrace } from '../core/trace-context.ts'
import type { ProduceService } from './produce.ts'
import type { AppendEntry, Coordinates } from '../store/messages.ts'
import { planTicks, tickClock, type TickClock } from './schedule-times.ts'

/** How often each process records that it is alive and looks for schedules written elsewhere, ms. */
export const HEARTBEAT_MS = 1000
/** How long after its last heartbeat a process that stopped without saying so counts as running, ms. */
export const GRACE_MS = 3000
/** Schedules one tick transaction claims at most; ticks of one schedule it makes at most. */
const BATCH_SCHEDULES = 1000
const MAX_TICKS_PER_SCHEDULE = 100
/** Runners' spans kept this long after they end (older ticks than this are long made). */
const RUNNER_RETENTION_MS = 30 * 24 * 3600_000
/** After a failure, wait this long before the next round, ms. */
const RETRY_MS = 1000

export interface ScheduleTickerOptions {
  db: Database
  /** Where a message goes (HTTP produce's choice), and who is told of appended messages (its listeners). */
  produce: Pick<ProduceService, 'partitionFor' | 'notify'>
  /** `n` messages were appended to topic `name` (metrics). */
  onProduced?(name: string, n: number): void
  log: { warn(obj: object, msg: string): void; error(obj: object, msg: string): void }
  /** Test hooks: this process's runner id, and the heartbeat interval. */
  runnerId?: string
  heartbeatMs?: number
}

/** The header names a tick's message carries beside the schedule's own. */
export const SCHEDULE_HEADER = 'hookq-schedule'
export const TICK_HEADER = 'hookq-schedule-tick'

export class ScheduleTicker {
  readonly runnerId: string
  private readonly heartbeatMs: number
  private timer: NodeJS.Timeout | undefined
  private running: Promise<void> | undefined
  private again = false
  /** The timer was armed for a tick: the next round ticks before its heartbeat. */
  private tickExpected = false
  private stopped = true
  private failing = false
  /** Parsed timings by schedule id and text: parsing a cron per tick would cost more than the tick. */
  private readonly clocks = new Map<number, { key: string; clock: TickClock }>()

  constructor(private readonly opts: ScheduleTickerOptions) {
    this.runnerId = opts.runnerId ?? randomUUID()
    this.heartbeatMs = opts.heartbeatMs ?? HEARTBEAT_MS
  }

  start(): void {
    if (!this.stopped) return
    this.stopped = false
    pruneRunners(this.opts.db.pool, RUNNER_RETENTION_MS).catch((err: unknown) =>
      this.opts.log.warn({ err }, 'pruning old schedule runners failed; retrying at the next start'),
    )
    this.wake()
  }

  /** Looks at the schedules now (one was written here), or right after the round under way. */
  wake(): void {
    if (this.stopped) return
    if (this.running) {
      this.again = true
      return
    }
    clearTimeout(this.timer)
    this.running = this.round().then((delayMs) => {
      this.running = undefined
      if (this.again) {
        this.again = false
        delayMs = 0
      }
      this.arm(delayMs)
    })
  }

  /** Stops ticking: waits for a tick under way, then ends this process's span. */
  async stop(): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    clearTimeout(this.timer)
    await this.running
    await stopRunner(this.opts.db.pool, this.runnerId).catch((err: unknown) =>
      this.opts.log.warn({ err }, 'ending this process\u2019s schedule runner span failed; it ends by its grace instead'),
    )
  }

  private arm(delayMs: number): void {
    if (this.stopped) return
    clearTimeout(this.timer)
    this.timer = setTimeout(() => this.wake(), timerDelayMs(delayMs))
    this.timer.unref()
  }

  /**
   * Ticks while anything is due, and records the heartbeat (which finds the next tick); resolves with
   * how long to wait for the next round. A round the timer starts for a tick ticks first, the
   * heartbeat after it, off the tick's path. Never rejects.
   */
  private async round(): Promise<number> {
    let tickFirst = this.tickExpected
    this.tickExpected = false
    try {
      for (;;) {
        if (!tickFirst) {
          const beat = await heartbeat(this.opts.db.pool, this.runnerId)
          if (beat.earliestMs === null || beat.earliestMs > beat.nowMs) {
            this.recovered()
            const untilMs = beat.earliestMs === null ? Infinity : beat.earliestMs - beat.nowMs
            this.tickExpected = untilMs <= this.heartbeatMs
            return Math.min(this.heartbeatMs, untilMs)
          }
        }
        const topicNames = new Map<number, string>()
        const { claimed, entries, coordinates } = await tickDue(this.opts.db, BATCH_SCHEDULES, GRACE_MS, (due, nowMs, spans) =>
          due.map((d) => {
            topicNames.set(d.topicId, d.topic)
            return this.plan(d, nowMs, spans)
          }),
        )
        this.count(entries, coordinates, topicNames)
        this.announce(entries, coordinates)
        this.recovered()
        // Due rows all locked by others: they are ticking them; look again soon (a process killed
        // mid-tick frees its rows when PostgreSQL ends its session).
        if (claimed === 0 && !tickFirst) return Math.min(this.heartbeatMs, 50)
        tickFirst = false
        if (this.stopped) return 0
      }
    } catch (err) {
      if (!this.failing) this.opts.log.error({ err }, 'ticking schedules failed; retrying')
      this.failing = true
      return RETRY_MS
    }
  }

  private recovered(): void {
    if (this.failing) this.opts.log.warn({}, 'ticking schedules works again')
    this.failing = false
  }

  /** What one due schedule makes now: its ticks' messages, and its next tick. */
  private plan(d: DueSchedule, nowMs: number, spans: RunnerSpan[]): TickWrite {
    let clock: TickClock
    try {
      clock = this.clockOf(d)
    } catch (err) {
      // Written by a broker whose cron library or zone data took it; this one cannot: park it.
      this.opts.log.error({ err, schedule: d.name }, 'a schedule cannot be parsed here; it stops ticking until it is written again')
      return { id: d.id, messages: [], nextTickAt: null, lastTickAt: null }
    }
    const { ticks, next } = planTicks(clock, d.nextTickAt, nowMs, spans, d.missed, MAX_TICKS_PER_SCHEDULE)
    const base = JSON.parse(d.headers) as Record<string, string>
    const messages = ticks.map((tick) => {
      // Each tick's message starts a trace of its own, unless the schedule's headers carry one.
      const trace: MessageTrace = { traceId: '', traceparent: null, tracestate: null }
      messageTrace(base, null, trace)
      return {
        topicId: d.topicId,
        partition: this.opts.produce.partitionFor(d.topicId, d.partitions, d.key),
        key: d.key,
        value: d.value,
        headers: JSON.stringify({ ...base, [SCHEDULE_HEADER]: d.name, [TICK_HEADER]: new Date(tick).toISOString() }),
        delayMs: 0,
        idempotencyKey: null,
        ...trace,
      }
    })
    return { id: d.id, messages, nextTickAt: next, lastTickAt: ticks.at(-1) ?? null }
  }

  /** Wakes the dispatchers of the messages appended (this process's, and the others through the cluster), as HTTP produce does. */
  private announce(entries: AppendEntry[], coordinates: (Coordinates | null)[]): void {
    const byTopic = new Map<number, { entries: AppendEntry[]; coordinates: Coordinates[] }>()
    entries.forEach((e, i) => {
      const c = coordinates[i]
      if (!c) return
      let t = byTopic.get(e.topicId)
      if (!t) byTopic.set(e.topicId, (t = { entries: [], coordinates: [] }))
      t.entries.push(e)
      t.coordinates.push(c)
    })
    for (const [topicId, t] of byTopic) this.opts.produce.notify(topicId, t.entries, t.coordinates)
  }

  private count(entries: AppendEntry[], coordinates: (Coordinates | null)[], topicNames: Map<number, string>): void {
    if (!this.opts.onProduced) return
    const counts = new Map<number, number>()
    entries.forEach((e, i) => {
      if (coordinates[i]) counts.set(e.topicId, (counts.get(e.topicId) ?? 0) + 1)
    })
    for (const [topicId, n] of counts) this.opts.onProduced(topicNames.get(topicId) ?? String(topicId), n)
  }

  private clockOf(d: DueSchedule): TickClock {
    const key = `${d.cron ?? ''}|${d.everyMs ?? ''}|${d.timeZone}`
    const cached = this.clocks.get(d.id)
    if (cached?.key === key) return cached.clock
    const timing = d.everyMs !== null ? { everyMs: d.everyMs, timeZone: d.timeZone } : { cron: d.cron ?? '', timeZone: d.timeZone }
    const clock = tickClock(timing)
    // Bounded: ids of deleted schedules are forgotten when it fills (a cheap re-parse brings them back).
    if (this.clocks.size >= 10_000) this.clocks.clear()
    this.clocks.set(d.id, { key, clock })
    return clock
  }
}

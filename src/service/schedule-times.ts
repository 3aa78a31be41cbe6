/**
 * When a schedule ticks: parsing a `cron` or `every` timing, the next tick after an instant, the
 * latest one before it, and which ticks are due. Pure: no clock, no I/O (callers pass instants in
 * ms since the epoch).
 *
 * Cron expressions are parsed and stepped by croner (11.x) rather than cron-parser (5.x): croner has
 * no dependencies (cron-parser pulls in luxon), takes the 6-field form with seconds, names (MON,
 * JAN) and IANA time zones, and can step backwards (previousRuns), which `missed: "once"` needs.
 * Neither follows the contract's daylight-saving rules as they come (test/schedule-times.test.ts
 * shows both on Europe/Berlin's changes of 2026):
 * - a local time that a change skips must not tick: croner runs a fixed-time job (`30 2 * * *`) at
 *   the first valid time after the gap (03:00), cron-parser at 03:30. A candidate whose local
 *   wall-clock time does not match the expression is dropped here (croner's `match` reads it in the
 *   schedule's zone).
 * - a local time that a change repeats must tick once: croner runs an interval job (`0 * * * *`)
 *   on both 02:00s of the last Sunday of October, and so does cron-parser (yet not `*\/20 2 * * *`).
 *   A candidate whose local time an earlier instant already had (the second pass) is dropped here.
 * `every` ignores the time zone: its ticks are the Unix epoch plus multiples of it.
 */
import { Cron } from 'croner'
import { HookqError } from '../core/errors.ts'

/** How a schedule ticks, as the API takes it. */
export type Timing = { cron: string; timeZone: string } | { everyMs: number; timeZone: string }

/** The ticks of one timing. */
export interface TickClock {
  /** The first tick strictly after `afterMs`; null: none (a cron that never matches again). */
  next(afterMs: number): number | null
  /** The latest tick strictly before `beforeMs`; null: none. */
  previous(beforeMs: number): number | null
}

/** Candidates skipped in a row before giving up (a repeated hour of a every-second cron is 3,600). */
const MAX_STEPS = 100_000
/** Longer than any daylight-saving shift (they are 30 minutes to 2 hours). */
const SHIFT_BOUND_MS = 3 * 3600_000

/** Whether `zone` is an IANA time zone name this runtime knows. */
export function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: zone })
    return true
  } catch {
    return false
  }
}

/**
 * The clock of a timing, or a 400 naming what is wrong: an expression that is not 5 or 6 fields
 * croner accepts, an unknown zone, or a cron that never ticks.
 */
export function tickClock(timing: Timing): TickClock {
  if (!isTimeZone(timing.timeZone)) throw invalid(`timeZone ${JSON.stringify(timing.timeZone)} is not an IANA time zone name`)
  if ('everyMs' in timing) return everyClock(timing.everyMs)
  const fields = timing.cron.trim().split(/\s+/).length
  if (fields !== 5 && fields !== 6)
    throw invalid(`cron ${JSON.stringify(timing.cron)} has ${fields} fields; it needs 5, or 6 with seconds first`)
  let cron: Cron
  try {
    cron = new Cron(timing.cron, { timezone: timing.timeZone, paused: true, mode: '5-or-6-parts' })
  } catch (err) {
    throw invalid(`cron ${JSON.stringify(timing.cron)} is not a valid expression: ${(err as Error).message}`)
  }
  const clock = cronClock(cron, timing.timeZone)
  if (clock.next(0) === null) throw invalid(`cron ${JSON.stringify(timing.cron)} never ticks`)
  return clock
}

function everyClock(everyMs: number): TickClock {
  return {
    next: (afterMs) => (Math.floor(afterMs / everyMs) + 1) * everyMs,
    previous: (beforeMs) => (Math.ceil(beforeMs / everyMs) - 1) * everyMs,
  }
}

function cronClock(cron: Cron, zone: string): TickClock {
  const offset = offsetOf(zone)
  // Only the first of two instants with the same local time ticks (see the header).
  const repeated = (t: number): boolean => {
    const shift = offset(t - SHIFT_BOUND_MS) - offset(t)
    return shift > 0 && offset(t - shift) === offset(t) + shift
  }
  const fits = (t: number): boolean => cron.match(new Date(t)) && !repeated(t)
  return {
    next(afterMs) {
      let from = afterMs
      for (let i = 0; i < MAX_STEPS; i++) {
        const t = cron.nextRun(new Date(from))?.getTime()
        if (t === undefined) return null
        if (fits(t)) return t
        from = t
      }
      return null
    },
    previous(beforeMs) {
      let before = beforeMs
      for (let i = 0; i < MAX_STEPS; i++) {
        const t = cron.previousRuns(1, new Date(before))[0]?.getTime()
        if (t === undefined || t >= before) return null
        if (fits(t)) return t
        before = t
      }
      return null
    },
  }
}

/** The zone's UTC offset at an instant, ms (whole seconds: what the formatter shows). */
function offsetOf(zone: string): (t: number) => number {
  const format = new Intl.DateTimeFormat('en-US', {
    timeZone: zone,
    hourCycle: 'h23',
    year: 'numeric',
    month: 'numeric',
    day: 'numeric',
    hour: 'numeric',
    minute: 'numeric',
    second: 'numeric',
    era: 'short',
  })
  return (t) => {
    const p: Record<string, string> = {}
    for (const part of format.formatToParts(new Date(t))) p[part.type] = part.value
    const year = p.era === 'BC' ? 1 - Number(p.year) : Number(p.year)
    const wall = Date.UTC(year, Number(p.month) - 1, Number(p.day), Number(p.hour), Number(p.minute), Number(p.second))
    return wall - Math.floor(t / 1000) * 1000
  }
}

/** A span of time in which a broker process ran the ticker, [startMs, endMs]. */
export interface Span {
  startMs: number
  endMs: number
}

/** What a due schedule produces now: the ticks (ascending), and its next tick from then on. */
export interface TickPlan {
  ticks: number[]
  next: number | null
}

/**
 * The ticks of a schedule due at `nowMs`, from its first unproduced tick `fromMs`. A tick inside a
 * span (a broker ran then) is produced, however late: its producer may have died before making it.
 * Ticks in a stretch outside every span passed while no broker ran: none of them (`skip`) or the
 * latest of the stretch (`once`). At most `maxTicks`; `next` then names the first left for later.
 */
export function planTicks(
  clock: TickClock,
  fromMs: number,
  nowMs: number,
  spans: Span[],
  missed: 'skip' | 'once',
  maxTicks: number,
): TickPlan {
  const ticks: number[] = []
  let t: number | null = fromMs
  while (t !== null && t <= nowMs && ticks.length < maxTicks) {
    const at = t
    if (spans.some((s) => s.startMs <= at && at <= s.endMs)) {
      ticks.push(at)
      t = clock.next(at)
      continue
    }
    // The stretch without a broker runs until the next span starts (or now).
    const gapEndMs = Math.min(nowMs + 1, ...spans.filter((s) => s.startMs > at).map((s) => s.startMs))
    if (missed === 'once') {
      const latest = clock.previous(gapEndMs)
      if (latest !== null && latest >= at) ticks.push(latest)
    }
    t = clock.next(gapEndMs - 1)
  }
  return { ticks, next: t }
}

/** The first `n` ticks from `fromMs` on (it included when it is one). */
export function upcoming(clock: TickClock, fromMs: number, n: number): number[] {
  const out: number[] = []
  let t = clock.previous(fromMs + 1) === fromMs ? fromMs : clock.next(fromMs)
  while (t !== null && out.length < n) {
    out.push(t)
    t = clock.next(t)
  }
  return out
}

function invalid(detail: string): HookqError {
  return new HookqError('invalid_request', detail)
}

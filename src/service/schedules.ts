/**
 * The rules of schedules: what a PUT may say (cron or every, a time zone, the message), the view
 * with the next runs, deletion. The ticks themselves: src/service/schedule-ticker.ts.
 */
import { HookqError } from '../core/errors.ts'
import type { Database } from '../store/db.ts'
import { deleteSchedule, findSchedule, listSchedules, upsertSchedule, type ScheduleRow } from '../store/schedules.ts'
import { tickClock, upcoming, type Timing } from './schedule-times.ts'
import type { TopicService } from './topics.ts'
import { refuseBrokerHeadersOf } from './produce.ts'

/** A PUT's body, as the HTTP schema lets it through. */
export interface ScheduleInput {
  topic: string
  cron?: string
  every?: number
  timeZone?: string
  message: { value: unknown; key?: string; headers?: Record<string, string> }
  paused?: boolean
  missed?: 'skip' | 'once'
}

/** A schedule as the API shows it. */
export interface ScheduleView {
  name: string
  topic: string
  cron?: string
  every?: number
  timeZone: string
  message: { value: unknown; key?: string; headers?: Record<string, string> }
  paused: boolean
  missed: 'skip' | 'once'
  /** The next 5 ticks (ISO-8601 UTC); none while paused. */
  nextRuns: string[]
  lastTickAt: string | null
  createdAt: string
  updatedAt: string
}

/** How many upcoming ticks a view lists. */
const NEXT_RUNS = 5

export class ScheduleService {
  private readonly listeners = new Set<() => void>()

  constructor(
    private readonly db: Database,
    private readonly topics: TopicService,
    private readonly maxMessageBytes: number,
  ) {}

  /** Told after a schedule is written (the ticker looks at once). */
  onChange(listener: () => void): void {
    this.listeners.add(listener)
  }

  /** Creates or replaces schedule `name`; 400 for a bad timing or message, 404 for an unknown topic. */
  async put(name: string, input: ScheduleInput): Promise<{ schedule: ScheduleView; created: boolean }> {
    if ((input.cron === undefined) === (input.every === undefined))
      throw new HookqError('invalid_request', 'a schedule needs exactly one of cron and every')
    const timeZone = input.timeZone ?? 'UTC'
    const timing: Timing = input.cron !== undefined ? { cron: input.cron, timeZone } : { everyMs: input.every!, timeZone }
    const clock = tickClock(timing)
    // A tick's message is produced by the broker on the schedule's behalf: the same header rule as produce.
    if (input.message.headers) refuseBrokerHeadersOf(input.message.headers, 'message')
    const value = JSON.stringify(input.message.value)
    const headers = JSON.stringify(input.message.headers ?? {})
    const key = input.message.key ?? null
    if (key !== null && !key.isWellFormed())
      throw new HookqError('invalid_request', 'message.key must be valid Unicode (no lone surrogates)')
    const size = Buffer.byteLength(value) + Buffer.byteLength(headers) + (key === null ? 0 : Buffer.byteLength(key))
    if (size > this.maxMessageBytes)
      throw new HookqError('message_too_large', `the message is ${size} bytes; the limit is ${this.maxMessageBytes} bytes`)
    const topic = await this.topics.requireFresh(input.topic)
    const paused = input.paused ?? false
    const { row, created } = await upsertSchedule(this.db.pool, {
      name,
      topicId: topic.id,
      cron: input.cron?.trim() ?? null,
      everyMs: input.every ?? null,
      timeZone,
      value,
      key,
      headers,
      paused,
      missed: input.missed ?? 'skip',
      nextTickAt: paused ? null : toDate(clock.next(Date.now())),
    })
    for (const listener of this.listeners) listener()
    return { schedule: view(row), created }
  }

  async get(name: string): Promise<ScheduleView> {
    const row = await findSchedule(this.db.pool, name)
    if (!row) throw notFound(name)
    return view(row)
  }

  /** The topic of schedule `name` (the access check of its routes); null for none. */
  async topicOf(name: string): Promise<string | null> {
    return (await findSchedule(this.db.pool, name))?.topic ?? null
  }

  async list(): Promise<ScheduleView[]> {
    return (await listSchedules(this.db.pool)).map(view)
  }

  /** Deletes the schedule; no tick follows. 404 when there is none. */
  async delete(name: string): Promise<void> {
    if (!(await deleteSchedule(this.db.pool, name))) throw notFound(name)
  }
}

function view(row: ScheduleRow): ScheduleView {
  const timing: Timing =
    row.everyMs !== null ? { everyMs: row.everyMs, timeZone: row.timeZone } : { cron: row.cron ?? '', timeZone: row.timeZone }
  let nextRuns: string[] = []
  if (!row.paused && row.nextTickAt !== null) {
    try {
      nextRuns = upcoming(tickClock(timing), row.nextTickAt.getTime(), NEXT_RUNS).map((ms) => new Date(ms).toISOString())
    } catch {
      // A timing this broker cannot parse (see the ticker): no runs to show.
    }
  }
  const headers = JSON.parse(row.headers) as Record<string, string>
  return {
    name: row.name,
    topic: row.topic,
    ...(row.cron !== null ? { cron: row.cron } : { every: row.everyMs! }),
    timeZone: row.timeZone,
    message: {
      value: JSON.parse(row.value) as unknown,
      ...(row.key !== null ? { key: row.key } : {}),
      ...(Object.keys(headers).length > 0 ? { headers } : {}),
    },
    paused: row.paused,
    missed: row.missed,
    nextRuns,
    lastTickAt: row.lastTickAt?.toISOString() ?? null,
    createdAt: row.createdAt.toISOString(),
    updatedAt: row.updatedAt.toISOString(),
  }
}

function toDate(ms: number | null): Date | null {
  return ms === null ? null : new Date(ms)
}

function notFound(name: string): HookqError {
  return new HookqError('schedule_not_found', `schedule ${name} does not exist`)
}

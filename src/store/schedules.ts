/**
 * Schedules in SQL, and the ticker's: the heartbeat of a broker process running the ticker
 * (schedule_runners), and the tick transaction. Why ticks are made this way:
 * src/service/schedule-ticker.ts.
 */
import { inTransaction, type Database, type Queryable } from './db.ts'
import { appendRows, type AppendEntry, type Coordinates } from './messages.ts'

/** A schedule as stored (the topic by name, as the API shows it). */
export interface ScheduleRow {
  id: number
  name: string
  topicId: number
  topic: string
  cron: string | null
  everyMs: number | null
  timeZone: string
  /** JSON text of the message's value */
  value: string
  key: string | null
  /** JSON text of an object of strings */
  headers: string
  paused: boolean
  missed: 'skip' | 'once'
  nextTickAt: Date | null
  lastTickAt: Date | null
  createdAt: Date
  updatedAt: Date
}

/** What a PUT writes; `nextTickAt` is the first tick from now (null while paused). */
export type ScheduleWrite = Omit<ScheduleRow, 'id' | 'topic' | 'lastTickAt' | 'createdAt' | 'updatedAt'>

// The stored columns every query reads, `columns('s')` for the alias a query gives the schedules
// (the topic's name comes from its join).
const COLUMNS = [
  'id',
  'name',
  'topic_id',
  'cron',
  'every_ms',
  'time_zone',
  'value',
  'key',
  'headers',
  'paused',
  'missed',
  'next_tick_at',
  'last_tick_at',
  'created_at',
  'updated_at',
]
const columns = (alias: string): string => COLUMNS.map((c) => `${alias}.${c}`).join(', ')

type Raw = {
  id: number
  name: string
  topic_id: number
  topic: string
  cron: string | null
  every_ms: number | null
  time_zone: string
  value: string
  key: string | null
  headers: string
  paused: boolean
  missed: string
  next_tick_at: Date | null
  last_tick_at: Date | null
  created_at: Date
  updated_at: Date
}

function toRow(r: Raw): ScheduleRow {
  return {
    id: r.id,
    name: r.name,
    topicId: r.topic_id,
    topic: r.topic,
    cron: r.cron,
    everyMs: r.every_ms,
    timeZone: r.time_zone,
    value: r.value,
    key: r.key,
    headers: r.headers,
    paused: r.paused,
    missed: r.missed === 'once' ? 'once' : 'skip',
    nextTickAt: r.next_tick_at,
    lastTickAt: r.last_tick_at,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  }
}

// Creates or replaces by name. A replacement that keeps the timing of a running schedule keeps its
// next tick (one due but not yet made is still made); a new timing, or a pause ending, starts from
// the next tick after now (the ticks passed while paused are not made), as does one a broker had to
// park (next_tick_at null: it could not parse it). The row lock this takes
// waits for a tick under way. "created": the row is new (xmax 0 on an inserted row).
const UPSERT = `
WITH written AS (
  INSERT INTO schedules AS s (name, topic_id, cron, every_ms, time_zone, value, key, headers, paused, missed, next_tick_at)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
  ON CONFLICT (name) DO UPDATE SET
    topic_id = EXCLUDED.topic_id, cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, time_zone = EXCLUDED.time_zone,
    value = EXCLUDED.value, key = EXCLUDED.key, headers = EXCLUDED.headers, paused = EXCLUDED.paused, missed = EXCLUDED.missed,
    next_tick_at = CASE
      WHEN NOT s.paused AND NOT EXCLUDED.paused AND s.cron IS NOT DISTINCT FROM EXCLUDED.cron
        AND s.every_ms IS NOT DISTINCT FROM EXCLUDED.every_ms AND s.time_zone = EXCLUDED.time_zone
      THEN coalesce(s.next_tick_at, EXCLUDED.next_tick_at) ELSE EXCLUDED.next_tick_at END,
    updated_at = now()
  RETURNING s.*, (xmax = 0) AS created
)
SELECT ${columns('w')}, t.name AS topic, w.created
FROM written w JOIN topics t ON t.id = w.topic_id`

/** Creates or replaces the schedule `w.name`; whether it was created. */
export async function upsertSchedule(q: Queryable, w: ScheduleWrite): Promise<{ row: ScheduleRow; created: boolean }> {
  const res = await q.query<Raw & { created: boolean }>(UPSERT, [
    w.name,
    w.topicId,
    w.cron,
    w.everyMs,
    w.timeZone,
    w.value,
    w.key,
    w.headers,
    w.paused,
    w.missed,
    w.nextTickAt,
  ])
  const r = res.rows[0]!
  return { row: toRow(r), created: r.created }
}

/** The schedule of that name, or null. */
export async function findSchedule(q: Queryable, name: string): Promise<ScheduleRow | null> {
  const res = await q.query<Raw>(
    `SELECT ${columns('s')}, t.name AS topic FROM schedules s JOIN topics t ON t.id = s.topic_id WHERE s.name = $1`,
    [name],
  )
  return res.rows[0] ? toRow(res.rows[0]) : null
}

/** Every schedule, by name. */
export async function listSchedules(q: Queryable): Promise<ScheduleRow[]> {
  const res = await q.query<Raw>(
    `SELECT ${columns('s')}, t.name AS topic FROM schedules s JOIN topics t ON t.id = s.topic_id ORDER BY s.name`,
  )
  return res.rows.map(toRow)
}

/**
 * Deletes the schedule; false when there was none. The DELETE waits for a tick transaction that
 * holds the row, and once it commits no tick can claim the row again.
 */
export async function deleteSchedule(q: Queryable, name: string): Promise<boolean> {
  return ((await q.query('DELETE FROM schedules WHERE name = $1', [name])).rowCount ?? 0) > 0
}

/** The database's clock now, and the earliest next tick of any schedule (null: none due ever). */
export interface Heartbeat {
  nowMs: number
  earliestMs: number | null
}

// The runner's row, created or brought up to now. Committed without waiting for the WAL flush
// (synchronous_commit off for this statement's transaction): a heartbeat a server crash loses ends
// a span a second early, which GRACE_MS covers, and an idle broker does not pay a flush a second.
const HEARTBEAT = `
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
beat AS (
  INSERT INTO schedule_runners (id, started_at, alive_at) VALUES ($1, clock_timestamp(), clock_timestamp())
  ON CONFLICT (id) DO UPDATE SET alive_at = clock_timestamp()
  RETURNING id
)
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms,
       (SELECT (extract(epoch FROM min(next_tick_at)) * 1000)::float8 FROM schedules) AS earliest_ms
FROM beat, async`

/** Records that runner `id` is alive now; answers the database's clock and the earliest next tick. */
export async function heartbeat(q: Queryable, id: string): Promise<Heartbeat> {
  const res = await q.query<{ now_ms: number; earliest_ms: number | null }>({
    name: 'hookq_schedule_heartbeat',
    text: HEARTBEAT,
    values: [id],
  })
  const r = res.rows[0]!
  return { nowMs: r.now_ms, earliestMs: r.earliest_ms }
}

/** Runner `id` stops cleanly: its span ends now, exactly. */
export async function stopRunner(q: Queryable, id: string): Promise<void> {
  await q.query('UPDATE schedule_runners SET alive_at = clock_timestamp(), stopped_at = clock_timestamp() WHERE id = $1', [id])
}

/** Forgets runners whose span ended more than `keepMs` ago. */
export async function pruneRunners(q: Queryable, keepMs: number): Promise<void> {
  await q.query(`DELETE FROM schedule_runners WHERE alive_at < clock_timestamp() - make_interval(secs => $1::float8 / 1000)`, [keepMs])
}

/** A due schedule as the tick transaction sees it. */
export type DueSchedule = Pick<
  ScheduleRow,
  'id' | 'name' | 'topicId' | 'topic' | 'cron' | 'everyMs' | 'timeZone' | 'value' | 'key' | 'headers' | 'missed'
> & {
  /** The topic's partition count (a tick's message is placed as HTTP produce places it). */
  partitions: number
  /** The tick due, ms since the epoch. */
  nextTickAt: number
}

/** A span in which a runner was alive: [startMs, endMs], the end `graceMs` past its last heartbeat unless it stopped cleanly. */
export interface RunnerSpan {
  startMs: number
  endMs: number
}

/** What the tick transaction writes for one claimed schedule. */
export interface TickWrite {
  id: number
  /** Messages to append, one per tick. */
  messages: AppendEntry[]
  nextTickAt: number | null
  /** The latest tick made (null: none, the row's stays). */
  lastTickAt: number | null
}

// The oldest due schedules no other process is ticking, locked until this transaction ends, each
// with the runners' spans that end after the oldest of their ticks (one round trip for both).
const CLAIM = `
WITH due AS (
  SELECT s.*
  FROM schedules s
  WHERE s.next_tick_at <= clock_timestamp()
  ORDER BY s.next_tick_at
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
SELECT ${columns('due')}, t.name AS topic, t.partitions,
       (extract(epoch FROM due.next_tick_at) * 1000)::float8 AS next_ms,
       (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms,
       (SELECT coalesce(json_agg(json_build_array(extract(epoch FROM r.started_at) * 1000, extract(epoch FROM r.ends) * 1000)), '[]')
        FROM (SELECT started_at, coalesce(stopped_at, alive_at + make_interval(secs => $2::float8 / 1000)) AS ends FROM schedule_runners) r
        WHERE r.ends >= (SELECT min(next_tick_at) FROM due)) AS spans
FROM due JOIN topics t ON t.id = due.topic_id`

// The schedules move on to their next ticks.
const ADVANCE = `
UPDATE schedules s SET next_tick_at = to_timestamp(u.next_ms / 1000),
                       last_tick_at = coalesce(to_timestamp(u.last_ms / 1000), s.last_tick_at)
FROM unnest($1::int[], $2::float8[], $3::float8[]) AS u(id, next_ms, last_ms)
WHERE s.id = u.id`

/** What a tick transaction did: schedules claimed, and the messages appended with where they landed (null: topic gone). */
export interface Ticked {
  claimed: number
  entries: AppendEntry[]
  coordinates: (Coordinates | null)[]
}

/**
 * One tick transaction: claims up to `limit` due schedules (FOR UPDATE SKIP LOCKED), asks `plan`
 * what each makes (given the database's clock and the runners' spans, a killed runner's ending
 * `graceMs` after its last heartbeat), then appends the messages to their topics (the APPEND of
 * HTTP produce: dense offsets under the partition rows' locks) and moves each schedule's next tick
 * on, and commits all of it together: a tick is made exactly once, or (rolled back, the process
 * killed) not yet. Lock order: schedule rows, then partition rows (deleting a topic deletes its
 * schedules first, in the same order). Five round trips.
 */
export async function tickDue(
  db: Database,
  limit: number,
  graceMs: number,
  plan: (due: DueSchedule[], nowMs: number, spans: RunnerSpan[]) => TickWrite[],
): Promise<Ticked> {
  return inTransaction(db, async (client) => {
    const claimed = await client.query<Raw & { partitions: number; next_ms: number; now_ms: number; spans: [number, number][] }>({
      name: 'hookq_schedule_claim',
      text: CLAIM,
      values: [limit, graceMs],
    })
    if (claimed.rows.length === 0) return { claimed: 0, entries: [], coordinates: [] }
    const due: DueSchedule[] = claimed.rows.map((r) => {
      const { id, name, topicId, topic, cron, everyMs, timeZone, value, key, headers, missed } = toRow(r)
      return {
        id,
        name,
        topicId,
        topic,
        cron,
        everyMs,
        timeZone,
        value,
        key,
        headers,
        missed,
        partitions: r.partitions,
        nextTickAt: r.next_ms,
      }
    })
    const first = claimed.rows[0]!
    const writes = plan(
      due,
      first.now_ms,
      first.spans.map(([startMs, endMs]) => ({ startMs, endMs })),
    )
    await client.query({
      name: 'hookq_schedule_advance',
      text: ADVANCE,
      values: [writes.map((w) => w.id), writes.map((w) => w.nextTickAt), writes.map((w) => w.lastTickAt)],
    })
    // The append last: the partition rows it locks (which HTTP producers wait on) are held only
    // for it and the COMMIT.
    const entries = writes.flatMap((w) => w.messages)
    const coordinates: (Coordinates | null)[] = new Array(entries.length).fill(null)
    if (entries.length > 0) {
      for (const row of await appendRows(client, entries)) {
        coordinates[row.ord - 1] = { partition: row.partition, offset: row.offset, duplicate: false, producedAtMs: row.at_ms }
      }
    }
    return { claimed: due.length, entries, coordinates }
  })
}

/** Schemas of the schedules resource. */
import { Type } from 'typebox'
import { ALLOW_NUL, NAME_PATTERN, ref } from './common.ts'
import { MAX_MESSAGE_HEADERS } from './messages.ts'

export const ScheduleParams = Type.Object({
  name: Type.String({ pattern: NAME_PATTERN, description: 'Schedule name' }),
})

const ScheduleMessage = Type.Object(
  {
    value: Type.Unknown({ description: 'Any JSON value' }),
    key: Type.Optional(Type.String({ maxLength: 4096 })),
    headers: Type.Optional(
      Type.Record(Type.String(), Type.String({ [ALLOW_NUL]: true }), {
        propertyNames: Type.String({ minLength: 1, maxLength: 256 }),
        maxProperties: MAX_MESSAGE_HEADERS,
        description: 'Sent with every tick, beside hookq-schedule and hookq-schedule-tick',
      }),
    ),
  },
  { additionalProperties: false, description: 'The message each tick produces' },
)

const Missed = Type.Union([Type.Literal('skip'), Type.Literal('once')], {
  description: 'Ticks that passed while no broker ran: none (skip) or the latest of them, once, at start',
})

export const ScheduleConfig = Type.Object(
  {
    topic: Type.String({ pattern: NAME_PATTERN }),
    cron: Type.Optional(
      Type.String({ minLength: 1, maxLength: 1000, description: '5 fields, or 6 with seconds first; names like MON and JAN allowed' }),
    ),
    every: Type.Optional(
      Type.Integer({ minimum: 1000, maximum: 3_153_600_000_000, description: 'ms; ticks at the Unix epoch plus multiples of it' }),
    ),
    timeZone: Type.Optional(Type.String({ minLength: 1, maxLength: 100, description: 'IANA time zone of the cron (default UTC)' })),
    message: ScheduleMessage,
    paused: Type.Optional(Type.Boolean({ description: 'Produces nothing while true' })),
    missed: Type.Optional(Missed),
  },
  { $id: 'ScheduleConfig', additionalProperties: false, description: 'Exactly one of cron and every' },
)

export const Schedule = Type.Object(
  {
    name: Type.String(),
    topic: Type.String(),
    cron: Type.Optional(Type.String()),
    every: Type.Optional(Type.Integer()),
    timeZone: Type.String(),
    message: ScheduleMessage,
    paused: Type.Boolean(),
    missed: Missed,
    nextRuns: Type.Array(Type.String({ format: 'date-time' }), { description: 'The next 5 ticks; none while paused' }),
    lastTickAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'The latest tick made; null before the first',
    }),
    createdAt: Type.String({ format: 'date-time' }),
    updatedAt: Type.String({ format: 'date-time' }),
  },
  { $id: 'Schedule' },
)

export const ScheduleList = Type.Object({ schedules: Type.Array(ref(Schedule)) }, { $id: 'ScheduleList' })

export const scheduleSchemas = [ScheduleConfig, Schedule, ScheduleList]

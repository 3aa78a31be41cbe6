/** Schedule routes: create or replace (PUT), list, describe, delete. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Services } from '../../service/services.ts'
import type { ScheduleInput } from '../../service/schedules.ts'
import { problems, ref } from '../schemas/common.ts'
import { Schedule, ScheduleConfig, ScheduleList, ScheduleParams } from '../schemas/schedules.ts'
import { access } from '../scopes.ts'

const tags = ['schedules']

export function scheduleRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/schedules/:name',
      {
        // An admin scope covers the schedules of its topics: the body's topic and the stored one.
        ...access({ action: 'admin', on: 'schedule' }),
        schema: {
          operationId: 'putSchedule',
          tags,
          summary: 'Create or replace a schedule that produces a message on every tick',
          params: ScheduleParams,
          body: ref(ScheduleConfig),
          response: { 200: ref(Schedule), 201: ref(Schedule), ...problems(400, 401, 404, 413, 415, 503) },
        },
      },
      async (req, reply) => {
        const { schedule, created } = await services.schedules.put(req.params.name, req.body as ScheduleInput)
        return reply.code(created ? 201 : 200).send(schedule)
      },
    )

    app.get(
      '/v1/schedules',
      {
        // Any key: the answer lists the schedules of topics the key administers.
        ...access({ on: 'list' }),
        schema: {
          operationId: 'listSchedules',
          tags,
          summary: 'List schedules with their next runs',
          response: { 200: ref(ScheduleList), ...problems(401, 503) },
        },
      },
      async (req) => ({ schedules: (await services.schedules.list()).filter((s) => req.access.allows('admin', { topics: [s.topic] })) }),
    )

    app.get(
      '/v1/schedules/:name',
      {
        ...access({ action: 'admin', on: 'schedule' }),
        schema: {
          operationId: 'getSchedule',
          tags,
          summary: 'Describe a schedule: its fields, its next 5 runs and its last tick',
          params: ScheduleParams,
          response: { 200: ref(Schedule), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => services.schedules.get(req.params.name),
    )

    app.delete(
      '/v1/schedules/:name',
      {
        ...access({ action: 'admin', on: 'schedule' }),
        schema: {
          operationId: 'deleteSchedule',
          tags,
          summary: 'Delete a schedule; no tick follows the answer',
          params: ScheduleParams,
          response: { 204: { type: 'null', description: 'Deleted' }, ...problems(400, 401, 404, 503) },
        },
      },
      async (req, reply) => {
        await services.schedules.delete(req.params.name)
        return reply.code(204).send(null)
      },
    )
  }
}

/** The operator's routes on a group: the delivery log and seek. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { problems, ref } from '../schemas/common.ts'
import { GroupParams } from '../schemas/groups.ts'
import { DeliveriesQuery, DeliveryList, SeekRequest, SeekResponse } from '../schemas/operations.ts'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

const tags = ['operations']

export function operationRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/v1/groups/:group/deliveries',
      {
        ...access({ action: 'consume', on: 'group' }),
        schema: {
          operationId: 'listDeliveries',
          tags,
          summary: 'Every push attempt of a group, newest first, filtered and paged',
          params: GroupParams,
          querystring: DeliveriesQuery,
          response: { 200: ref(DeliveryList), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => services.operations.deliveries(req.params.group, req.query),
    )

    app.post(
      '/v1/groups/:group/seek',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'seek',
          tags,
          summary: 'Move committed offsets to an offset or a time: replay or skip messages',
          params: GroupParams,
          body: ref(SeekRequest),
          response: { 200: ref(SeekResponse), ...problems(400, 401, 404, 415, 503) },
        },
      },
      async (req) => services.operations.seek(req.params.group, req.body),
    )
  }
}

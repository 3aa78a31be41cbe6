/** Ack, nack and extend: the consumer's side of explicit acknowledgement. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { problems, ref } from '../schemas/common.ts'
import { AckRequest, AckResponse, ExtendRequest, NackRequest } from '../schemas/acks.ts'
import { GroupParams } from '../schemas/groups.ts'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

const tags = ['acks']
const response = { 200: ref(AckResponse), ...problems(400, 401, 404, 415, 503) }

export function ackRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/groups/:group/acks',
      {
        ...access({ action: 'consume', on: 'group' }),
        schema: {
          operationId: 'ack',
          tags,
          summary: 'Acknowledge deliveries: their messages are completed (durable when answered)',
          params: GroupParams,
          body: ref(AckRequest),
          response,
        },
      },
      async (req) => ({ results: await services.acks.ack(req.params.group, req.body.deliveryIds) }),
    )

    app.post(
      '/v1/groups/:group/nacks',
      {
        ...access({ action: 'consume', on: 'group' }),
        schema: {
          operationId: 'nack',
          tags,
          summary: 'Reject deliveries: a failed attempt, pushed again later or dead-lettered',
          params: GroupParams,
          body: ref(NackRequest),
          response,
        },
      },
      async (req) => ({
        results: await services.acks.nack(req.params.group, req.body.deliveryIds, req.body.delayMs, req.body.deadLetter ?? false),
      }),
    )

    app.post(
      '/v1/groups/:group/extend',
      {
        ...access({ action: 'consume', on: 'group' }),
        schema: {
          operationId: 'extend',
          tags,
          summary: 'Move ack deadlines to now + extendMs',
          params: GroupParams,
          body: ref(ExtendRequest),
          response,
        },
      },
      async (req) => ({ results: await services.acks.extend(req.params.group, req.body.deliveryIds, req.body.extendMs) }),
    )
  }
}

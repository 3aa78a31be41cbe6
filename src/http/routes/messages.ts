/** Produce and fetch routes. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { problems, ref } from '../schemas/common.ts'
import {
  FetchQuery,
  FetchResponse,
  IdempotencyKeysRequest,
  IdempotencyKeysResponse,
  PartitionParams,
  ProduceRequest,
  ProduceResponse,
} from '../schemas/messages.ts'
import { TopicParams } from '../schemas/topics.ts'
import { fetchBody } from '../fetch-body.ts'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

const tags = ['messages']

export function messageRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.post(
      '/v1/topics/:topic/messages',
      {
        ...access({ action: 'produce', on: 'topic' }),
        schema: {
          operationId: 'produce',
          tags,
          summary: 'Produce messages; answered once they are durably committed, all or nothing',
          params: TopicParams,
          body: ref(ProduceRequest),
          response: { 201: ref(ProduceResponse), ...problems(400, 401, 404, 413, 415, 429, 503) },
        },
      },
      async (req, reply) => {
        const results = await services.produce.produce(req.params.topic, req.body.messages, {
          traceparent: req.headers.traceparent,
          tracestate: req.headers.tracestate,
        })
        services.metrics.produced(req.params.topic, results.filter((r) => !r.duplicate).length)
        return reply.code(201).send({ results })
      },
    )

    app.post(
      '/v1/topics/:topic/idempotency-keys',
      {
        ...access({ action: 'produce', on: 'topic' }),
        schema: {
          operationId: 'findIdempotencyKeys',
          tags,
          summary: 'Which of these idempotency keys a produce would answer as duplicates, and where their messages are; stores nothing',
          params: TopicParams,
          body: ref(IdempotencyKeysRequest),
          response: { 200: ref(IdempotencyKeysResponse), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => ({ keys: await services.read.storedIdempotencyKeys(req.params.topic, req.body.keys) }),
    )

    app.get(
      '/v1/topics/:topic/partitions/:partition/messages',
      {
        ...access({ action: 'produce', on: 'topic' }),
        schema: {
          operationId: 'fetchMessages',
          tags,
          summary: 'Read a partition in offset order',
          params: PartitionParams,
          querystring: FetchQuery,
          response: { 200: ref(FetchResponse), ...problems(400, 401, 404, 503) },
        },
      },
      async (req, reply) => {
        const page = await services.read.fetch(req.params.topic, req.params.partition, req.query.fromOffset ?? 0, req.query.limit ?? 100)
        // FetchResponse as JSON text with its type: Fastify sends it as it is (see fetch-body.ts); the
        // type provider expects the object, hence the cast.
        return reply.type('application/json; charset=utf-8').send(fetchBody(page) as never)
      },
    )
  }
}

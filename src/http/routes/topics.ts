/** Topic routes: create (idempotent PUT), list, describe, delete. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { topicView } from '../../service/topics.ts'
import { problems, ref } from '../schemas/common.ts'
import { Topic, TopicConfig, TopicDetail, TopicList, TopicParams } from '../schemas/topics.ts'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

const tags = ['topics']

export function topicRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/topics/:topic',
      {
        ...access({ action: 'admin', on: 'topic' }),
        schema: {
          operationId: 'putTopic',
          tags,
          summary: 'Create a topic, or confirm it exists with this configuration',
          params: TopicParams,
          body: ref(TopicConfig),
          response: { 200: ref(Topic), 201: ref(Topic), ...problems(400, 401, 409, 415, 503) },
        },
      },
      async (req, reply) => {
        const { topic, created } = await services.topics.put(req.params.topic, req.body.partitions, req.body.retentionMs)
        return reply.code(created ? 201 : 200).send(topicView(topic))
      },
    )

    app.get(
      '/v1/topics',
      {
        ...access({ on: 'list' }),
        schema: { operationId: 'listTopics', tags, summary: 'List topics', response: { 200: ref(TopicList), ...problems(401, 503) } },
      },
      // Only the topics the key may read (produce or admin on them).
      async (req) => ({ topics: (await services.topics.list()).filter((t) => req.access.seesTopic(t.name)).map(topicView) }),
    )

    app.get(
      '/v1/topics/:topic',
      {
        ...access({ action: 'produce', on: 'topic' }),
        schema: {
          operationId: 'getTopic',
          tags,
          summary: "Describe a topic with its partitions' offsets and the storage its messages take",
          params: TopicParams,
          response: { 200: ref(TopicDetail), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => {
        const { topic, partitionStats, storage } = await services.topics.describe(req.params.topic)
        return {
          ...topicView(topic),
          partitionStats,
          storage: { ...storage, oldestMessageAt: storage.oldestMs === null ? null : new Date(storage.oldestMs).toISOString() },
        }
      },
    )

    app.delete(
      '/v1/topics/:topic',
      {
        ...access({ action: 'admin', on: 'topic' }),
        schema: {
          operationId: 'deleteTopic',
          tags,
          summary: 'Delete a topic with its messages',
          params: TopicParams,
          response: { 204: { type: 'null', description: 'Deleted' }, ...problems(400, 401, 404, 503) },
        },
      },
      async (req, reply) => {
        await services.topics.delete(req.params.topic)
        return reply.code(204).send(null)
      },
    )
  }
}

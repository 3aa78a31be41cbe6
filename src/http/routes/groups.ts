/** Consumer group and consumer routes. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { consumerView, groupView, rotationView } from '../../service/groups.ts'
import { problems, ref } from '../schemas/common.ts'
import {
  Consumer,
  ConsumerCreate,
  ConsumerList,
  ConsumerPatch,
  ConsumerParams,
  Group,
  GroupConfig,
  GroupList,
  GroupParams,
  GroupStatus,
  RotatedConsumer,
  SecretRotation,
} from '../schemas/groups.ts'
import { access } from '../scopes.ts'
import { redactUrl } from '../../security/redact-url.ts'
import type { Services } from '../../service/services.ts'

const tags = ['groups']

export function groupRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.put(
      '/v1/groups/:group',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'putGroup',
          tags,
          summary: 'Create or update a consumer group',
          params: GroupParams,
          body: ref(GroupConfig),
          response: { 200: ref(Group), 201: ref(Group), ...problems(400, 401, 404, 409, 415, 503) },
        },
      },
      async (req, reply) => {
        const { group, created } = await services.groups.put(req.params.group, req.body)
        return reply.code(created ? 201 : 200).send(groupView(group))
      },
    )

    app.get(
      '/v1/groups',
      {
        ...access({ on: 'list' }),
        schema: {
          operationId: 'listGroups',
          tags,
          summary: 'List consumer groups',
          response: { 200: ref(GroupList), ...problems(401, 503) },
        },
      },
      // Only the groups the key may read (consume or admin on them).
      async (req) => ({ groups: (await services.groups.list()).filter((g) => req.access.seesGroup(g.name, g.topic)).map(groupView) }),
    )

    app.get(
      '/v1/groups/:group',
      {
        ...access({ action: 'consume', on: 'group' }),
        schema: {
          operationId: 'getGroup',
          tags,
          summary: 'A group with its per-partition offsets, lag and consumers',
          params: GroupParams,
          response: { 200: ref(GroupStatus), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => {
        const status = await services.groups.status(
          req.params.group,
          (groupId, partition) => req.inFlightElsewhere?.get(partition) ?? services.inFlight(groupId, partition),
        )
        // Consumer URLs may carry credentials (a token in the query, user:password@): shown whole
        // only to keys that administer the group; a consume key sees them redacted.
        if (req.access.allows('admin', { group: status.name, topics: [status.topic] })) return status
        return { ...status, consumers: status.consumers.map(redactConsumer) }
      },
    )

    app.delete(
      '/v1/groups/:group',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'deleteGroup',
          tags,
          summary: 'Delete a group with its consumers, offsets and attempts',
          params: GroupParams,
          response: { 204: { type: 'null', description: 'Deleted' }, ...problems(400, 401, 404, 503) },
        },
      },
      async (req, reply) => {
        await services.groups.delete(req.params.group)
        return reply.code(204).send(null)
      },
    )

    app.post(
      '/v1/groups/:group/consumers',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'addConsumer',
          tags,
          summary: 'Register a webhook consumer',
          params: GroupParams,
          body: ref(ConsumerCreate),
          response: { 201: ref(Consumer), ...problems(400, 401, 404, 415, 503) },
        },
      },
      async (req, reply) => {
        const consumer = await services.groups.addConsumer(req.params.group, req.body)
        return reply.code(201).send(consumerView(consumer))
      },
    )

    app.patch(
      '/v1/groups/:group/consumers/:id',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'updateConsumer',
          tags,
          summary: "Change a consumer's url or limits in place; its partitions stay",
          params: ConsumerParams,
          body: ref(ConsumerPatch),
          response: { 200: ref(Consumer), ...problems(400, 401, 404, 415, 503) },
        },
      },
      async (req) => consumerView(await services.groups.updateConsumer(req.params.group, req.params.id, req.body)),
    )

    app.get(
      '/v1/groups/:group/consumers',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'listConsumers',
          tags,
          summary: "List a group's consumers",
          params: GroupParams,
          response: { 200: ref(ConsumerList), ...problems(400, 401, 404, 503) },
        },
      },
      async (req) => ({ consumers: (await services.groups.consumers(req.params.group)).map(consumerView) }),
    )

    app.post(
      '/v1/groups/:group/consumers/:id/secret',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'rotateConsumerSecret',
          tags,
          summary: "Rotate a consumer's secret; the old one keeps signing pushes for overlapMs",
          description:
            'The given secret, or a generated one, becomes current; the current one becomes the previous secret until now + overlapMs. ' +
            "Until then every push carries two v1 signatures in webhook-signature, the new secret's first. " +
            'A generated secret is returned in this answer only.',
          params: ConsumerParams,
          body: ref(SecretRotation),
          response: { 200: ref(RotatedConsumer), ...problems(400, 401, 404, 415, 503) },
        },
      },
      async (req) => {
        const { consumer, generated } = await services.groups.rotateSecret(req.params.group, req.params.id, req.body)
        return rotationView(consumer, generated)
      },
    )

    app.delete(
      '/v1/groups/:group/consumers/:id',
      {
        ...access({ action: 'admin', on: 'group' }),
        schema: {
          operationId: 'removeConsumer',
          tags,
          summary: 'Remove a consumer; its partitions move to the others',
          params: ConsumerParams,
          response: { 204: { type: 'null', description: 'Removed' }, ...problems(400, 401, 404, 503) },
        },
      },
      async (req, reply) => {
        await services.groups.removeConsumer(req.params.group, req.params.id)
        return reply.code(204).send(null)
      },
    )
  }
}

/**
 * A consumer as a key that does not administer its group sees it: URLs (its own, and an OAuth token
 * URL) may carry credentials in their query or user info, so those parts are hidden.
 */
function redactConsumer<C extends { url: string; auth?: unknown }>(c: C): C {
  const auth = c.auth as { tokenUrl?: unknown } | null | undefined
  const redactedAuth = auth && typeof auth.tokenUrl === 'string' ? { auth: { ...auth, tokenUrl: redactUrl(auth.tokenUrl) } } : {}
  return { ...c, url: redactUrl(c.url), ...redactedAuth }
}

/**
 * API keys: POST, GET /v1/keys and DELETE /v1/keys/{id}, for an admin key without patterns. The
 * key's text is in the answer to POST only. Creation and deletion are logged with the key's id
 * and the id of the key that asked (`audit`), never a key.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { HookqError } from '../../core/errors.ts'
import type { Services } from '../../service/services.ts'
import { problems, ref } from '../schemas/common.ts'
import { CreatedKey, KeyCreate, KeyList, KeyParams } from '../schemas/keys.ts'
import { access } from '../scopes.ts'

const tags = ['keys']

export function keyRoutes(services: Services, enabled: boolean): FastifyPluginAsyncTypebox {
  return async (app) => {
    // Without HOOKQ_API_KEYS the API is open: a key made then would protect nothing.
    if (!enabled) {
      app.addHook('preHandler', async () => {
        throw new HookqError('forbidden', 'API keys are managed only when authentication is on (HOOKQ_API_KEYS); it is off')
      })
    }

    app.post(
      '/v1/keys',
      {
        ...access({ on: 'everything' }),
        schema: {
          operationId: 'createKey',
          tags,
          summary: 'Make an API key scoped to topics and groups; the key is in this answer only',
          body: ref(KeyCreate),
          response: { 201: ref(CreatedKey), ...problems(400, 401, 415, 503) },
        },
      },
      async (req, reply) => {
        const { view, key } = await services.keys.create(req.body)
        req.log.info({ audit: 'key_created', keyId: view.id, byKeyId: req.access.keyId, scopes: view.scopes }, 'API key created')
        return reply.code(201).send({ ...view, key })
      },
    )

    app.get(
      '/v1/keys',
      {
        ...access({ on: 'everything' }),
        schema: {
          operationId: 'listKeys',
          tags,
          summary: 'List the API keys made with POST /v1/keys (never the keys themselves)',
          response: { 200: ref(KeyList), ...problems(401, 503) },
        },
      },
      async () => ({ keys: await services.keys.list() }),
    )

    app.delete(
      '/v1/keys/:id',
      {
        ...access({ on: 'everything' }),
        schema: {
          operationId: 'deleteKey',
          tags,
          summary: 'Delete an API key: every broker process refuses it within 2 s',
          params: KeyParams,
          response: { 204: { type: 'null', description: 'Deleted' }, ...problems(401, 404, 503) },
        },
      },
      async (req, reply) => {
        await services.keys.delete(req.params.id)
        req.log.info({ audit: 'key_deleted', keyId: req.params.id, byKeyId: req.access.keyId }, 'API key deleted')
        return reply.code(204).send(null)
      },
    )
  }
}

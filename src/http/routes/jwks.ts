/** GET /.well-known/jwks.json: the public keys of the broker's push JWTs. Open, like /healthz: they are public keys. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Services } from '../../service/services.ts'

export function jwksRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/.well-known/jwks.json',
      {
        schema: {
          operationId: 'jwks',
          tags: ['operations'],
          summary: 'The public keys that verify the JWTs of pushes to consumers with auth type "jwt", by kid',
          security: [],
          response: {
            200: {
              type: 'object',
              required: ['keys'],
              properties: { keys: { type: 'array', items: { type: 'object', additionalProperties: true } } },
            },
          },
        },
      },
      async (_req, reply) => {
        // Verifiers cache it; a rotation publishes a key well before it signs (src/dispatch/jwt-keys.ts).
        reply.header('cache-control', 'public, max-age=60')
        return services.jwks.list()
      },
    )
  }
}

/** Liveness and readiness. Both stay open when API keys are configured. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

const tags = ['operations']

export function healthRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/healthz',
      {
        ...access({ on: 'open' }),
        schema: { operationId: 'healthz', tags, summary: 'The process is alive', security: [], response: { 200: { $ref: 'Health#' } } },
      },
      async () => ({ status: 'ok' as const }),
    )

    app.get(
      '/readyz',
      {
        ...access({ on: 'open' }),
        schema: {
          operationId: 'readyz',
          tags,
          summary: 'The database is reachable and migrated',
          security: [],
          response: { 200: { $ref: 'Health#' }, 503: { $ref: 'Health#' } },
        },
      },
      async (_req, reply) => {
        const checks = await services.readiness()
        const ok = Object.values(checks).every((v) => v === 'ok')
        return reply.code(ok ? 200 : 503).send({ status: ok ? 'ok' : 'unavailable', checks })
      },
    )
  }
}

/**
 * GET /metrics: Prometheus text. It stays open when API keys are configured, like /healthz and
 * /readyz: scrapers rarely carry bearer keys, and it names groups and topics but no message content.
 */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { access } from '../scopes.ts'
import type { Services } from '../../service/services.ts'

export function metricsRoutes(services: Services): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/metrics',
      {
        ...access({ on: 'metrics' }),
        schema: {
          operationId: 'metrics',
          tags: ['operations'],
          summary: 'Prometheus metrics (text exposition format)',
          security: [],
          response: { 200: { description: 'Prometheus text', content: { 'text/plain': { schema: { type: 'string' } } } } },
        },
      },
      async (_req, reply) => {
        const { contentType, text } = await services.metrics.exposition()
        return reply.type(contentType).send(text)
      },
    )
  }
}

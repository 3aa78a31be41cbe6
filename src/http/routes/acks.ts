/** Ack, nack and extend: the consumer's side of explicit acknowledgement. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { problems, ref } from '../schemas/common.ts'
import { AckRequest, AckResponse, ExtendRequest, NackRequest, PullRequest, PullResponse } from '../schemas/acks.ts'
import { GroupParams } from '../schemas/groups.ts'
import { watchKey } from '../auth.ts'
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
      async (req) => {
        // Another broker process's gather giving back leases made here for a caller that went away
        // (src/http/forward.ts): leasable again at once, no attempt counted; no statuses to tell.
        if (req.giveBack !== null) {
          services.acks.giveBackForwarded(req.params.group, req.body.deliveryIds, req.giveBack)
          return { results: [] }
        }
        return {
          results: await services.acks.nack(req.params.group, req.body.deliveryIds, req.body.delayMs, req.body.deadLetter ?? false),
        }
      },
    )

    app.post(
      '/v1/groups/:group/pull',
      {
        ...access({ action: 'consume', on: 'group' }),
        // Every field is optional, so a bare `POST .../pull` (no body, as curl -X POST sends it)
        // means all defaults rather than a 400 for the missing object; a JSON null stays a 400.
        preValidation: async (req) => {
          if (req.body === undefined) req.body = {}
        },
        schema: {
          operationId: 'pull',
          tags,
          summary: "Lease a pull group's messages, waiting up to waitMs for the first",
          params: GroupParams,
          body: ref(PullRequest),
          response: { 200: ref(PullResponse), ...problems(400, 401, 404, 409, 415, 503) },
        },
      },
      async (req, reply) => {
        // The caller went away before its answer: nothing more is leased to it.
        const gone = new AbortController()
        // Gone already (during the key check, say): 'close' has fired and would not again. (The
        // socket, not the request: a request whose body was read is destroyed by then.)
        if (req.raw.socket?.destroyed === true) gone.abort()
        else
          reply.raw.once('close', () => {
            if (!reply.raw.writableFinished) gone.abort()
          })
        const { maxMessages = 100, waitMs = 0, leaseMs } = req.body ?? {}
        // A wait (up to 20 s) must not outlive the caller's key: once the key is deleted or expires,
        // nothing more is leased to it (as for a caller gone: what was leased for it is given back),
        // and the answer below is its 401.
        const unwatch = watchKey(req, () => gone.abort())
        try {
          // Another broker process's gather asking whether anything could be leased here
          // (src/http/forward.ts); sent as text: `ready` is not in the public schema.
          if (req.pullProbe) {
            const ready = await services.acks.probe(req.params.group, waitMs, gone.signal)
            await req.recheckKey()
            return reply.type('application/json').send(`{"messages":[],"ready":${ready}}` as never)
          }
          const envelopes = await services.acks.pull(req.params.group, { maxMessages, waitMs, leaseMs }, gone.signal, req.pullElsewhere)
          // Checked again at the answer (a lease may have been handed just as the key went): leases
          // made for a key no longer valid go to nobody; they expire and are retried, as a gone caller's do.
          await req.recheckKey()
          // Envelopes are JSON texts already (as pushed): joined, not parsed and serialised again.
          // For another process's gather, with the token that gives them back should its caller
          // have gone (src/http/forward.ts; never reaches a client, the gather keeps the messages only).
          const back =
            req.pullForwarded && envelopes.length > 0 ? `,"giveBack":"${services.acks.giveBackToken(req.params.group, envelopes)}"` : ''
          return reply.type('application/json').send(`{"messages":[${envelopes.join(',')}]${back}}` as never)
        } finally {
          unwatch()
        }
      },
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

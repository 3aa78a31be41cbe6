/** Schemas of acks, nacks and deadline extension. */
import { Type } from 'typebox'
import { ref } from './common.ts'

const DeliveryIds = Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { minItems: 1, maxItems: 1000 })

export const AckRequest = Type.Object({ deliveryIds: DeliveryIds }, { $id: 'AckRequest', additionalProperties: false })

export const NackRequest = Type.Object(
  {
    deliveryIds: DeliveryIds,
    delayMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: 86_400_000, description: 'Push again after this delay; without it, after the backoff' }),
    ),
    deadLetter: Type.Optional(Type.Boolean({ description: 'Dead-letter at once' })),
  },
  { $id: 'NackRequest', additionalProperties: false },
)

export const ExtendRequest = Type.Object(
  {
    deliveryIds: DeliveryIds,
    extendMs: Type.Integer({ minimum: 1, maximum: 43_200_000, description: 'The ack deadline becomes now + extendMs' }),
  },
  { $id: 'ExtendRequest', additionalProperties: false },
)

export const AckResult = Type.Object(
  {
    deliveryId: Type.String(),
    status: Type.Union([
      Type.Literal('acked'),
      Type.Literal('nacked'),
      Type.Literal('extended'),
      Type.Literal('already_completed'),
      Type.Literal('unknown'),
    ]),
  },
  { $id: 'AckResult' },
)

export const AckResponse = Type.Object({ results: Type.Array(ref(AckResult)) }, { $id: 'AckResponse' })

export const PullRequest = Type.Object(
  {
    maxMessages: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'Messages leased at most (default 100)' })),
    waitMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 20_000,
        description: 'Wait up to this long for a message that can be leased (default 0: answer at once)',
      }),
    ),
    leaseMs: Type.Optional(
      Type.Integer({
        minimum: 1000,
        maximum: 43_200_000,
        description: "Each message's ack deadline is now + leaseMs (default the group's ackTimeoutMs)",
      }),
    ),
  },
  { $id: 'PullRequest', additionalProperties: false },
)

/** A pulled message: the same envelope as a push's (src/dispatch/envelope.ts buildEnvelope). */
export const PulledMessage = Type.Object(
  {
    deliveryId: Type.String({ description: 'Ack, nack or extend with this id' }),
    topic: Type.String(),
    group: Type.String(),
    partition: Type.Integer(),
    offset: Type.Integer(),
    key: Type.Union([Type.String(), Type.Null()]),
    value: Type.Unknown({ description: 'The message as produced (any JSON value)' }),
    headers: Type.Record(Type.String(), Type.String()),
    attempt: Type.Integer({ description: '1 for the first lease or push, then one more per attempt' }),
    timestamp: Type.String({ format: 'date-time', description: 'When the message was produced' }),
    ackDeadline: Type.String({ format: 'date-time', description: 'The lease ends then: without an ack it is a failed attempt' }),
    traceparent: Type.String({ description: "W3C traceparent: the message's trace, a span id of this attempt's own" }),
    tracestate: Type.String({ description: 'The producer\'s W3C tracestate ("" when none)' }),
  },
  { $id: 'PulledMessage' },
)

export const PullResponse = Type.Object({ messages: Type.Array(ref(PulledMessage)) }, { $id: 'PullResponse' })

export const ackSchemas = [AckRequest, NackRequest, ExtendRequest, AckResult, AckResponse, PullRequest, PulledMessage, PullResponse]

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

export const ackSchemas = [AckRequest, NackRequest, ExtendRequest, AckResult, AckResponse]

/** Schemas of the operator's tools on a group: the delivery log and seek. */
import { Type } from 'typebox'
import { MAX_OFFSET, MAX_PARTITION, ref } from './common.ts'

const Outcome = () =>
  Type.Union([
    Type.Literal('acked'),
    Type.Literal('failed'),
    Type.Literal('timed_out'),
    Type.Literal('nacked'),
    Type.Literal('dead'),
    Type.Literal('in_flight'),
  ])

export const DeliveriesQuery = Type.Object(
  {
    partition: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_PARTITION })),
    offset: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_OFFSET })),
    outcome: Type.Optional(Outcome()),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
    cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 512, description: 'nextCursor of the previous page' })),
  },
  { additionalProperties: false },
)

export const Delivery = Type.Object(
  {
    deliveryId: Type.String(),
    partition: Type.Integer(),
    offset: Type.Integer(),
    attempt: Type.Integer({ description: '1 for the first push of the message' }),
    consumerId: Type.Union([Type.String(), Type.Null()]),
    startedAt: Type.String({ format: 'date-time' }),
    finishedAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    statusCode: Type.Union([Type.Integer(), Type.Null()], { description: "The consumer's HTTP status, if it answered" }),
    error: Type.Union([Type.String(), Type.Null()]),
    outcome: Outcome(),
    durationMs: Type.Union([Type.Integer(), Type.Null()], { description: 'Duration of the push HTTP call' }),
  },
  { $id: 'Delivery', description: 'One push attempt' },
)

export const DeliveryList = Type.Object(
  {
    deliveries: Type.Array(ref(Delivery), { description: 'Newest first' }),
    nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as `cursor` for the next page; null on the last' }),
  },
  { $id: 'DeliveryList' },
)

export const SeekRequest = Type.Object(
  {
    partition: Type.Optional(
      Type.Integer({ minimum: 0, maximum: MAX_PARTITION, description: 'The partition to move; all of them when absent' }),
    ),
    offset: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_OFFSET,
        description: "The new committed offset; at most the partition's end offset (with no partition named, at most every partition's)",
      }),
    ),
    timestamp: Type.Optional(
      Type.String({
        format: 'date-time',
        description: 'Per partition, the first offset produced at or after it (the end offset when none is)',
      }),
    ),
  },
  { $id: 'SeekRequest', additionalProperties: false, description: 'Exactly one of offset and timestamp' },
)

export const SeekResponse = Type.Object(
  {
    partitions: Type.Array(Type.Object({ partition: Type.Integer(), committedOffset: Type.Integer() }), {
      description: "The group's committed offsets after the seek, every partition",
    }),
  },
  { $id: 'SeekResponse' },
)

export const operationSchemas = [Delivery, DeliveryList, SeekRequest, SeekResponse]

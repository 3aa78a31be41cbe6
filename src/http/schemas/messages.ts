/** Schemas of produce and fetch. */
import { Type } from 'typebox'
import { ALLOW_NUL, MAX_OFFSET, MAX_PARTITION, NAME_PATTERN, ref } from './common.ts'

// Postgres text cannot hold NUL, so no string schema accepts it (src/http/validation.ts adds that
// rule to all of them). Values and header values can hold it: they are stored as JSON text, where
// it is escaped, so they come back as sent.
const HeaderName = Type.String({ minLength: 1, maxLength: 256 })
const HeaderValue = Type.String({ [ALLOW_NUL]: true })
/**
 * Headers one message may carry: each is stored, read back and, in raw format, pushed as part of
 * one HTTP header, so a thousand per message cost 1.3-2 s a call of 1,000 messages for no use.
 */
export const MAX_MESSAGE_HEADERS = 100

export const ProduceMessage = Type.Object(
  {
    value: Type.Unknown({ description: 'Any JSON value; comes back deep-equal' }),
    key: Type.Optional(
      Type.String({ maxLength: 4096, description: 'Messages with one key go to one partition (Kafka-compatible murmur2 hash)' }),
    ),
    // propertyNames, not Record's key schema alone: TypeBox turns that into a patternProperties
    // that names with NUL, empty or over 256 characters simply did not match, and so passed.
    headers: Type.Optional(
      Type.Record(Type.String(), HeaderValue, {
        propertyNames: HeaderName,
        maxProperties: MAX_MESSAGE_HEADERS,
        description: `At most ${MAX_MESSAGE_HEADERS}; names of 1 to 256 characters; values any string`,
      }),
    ),
    partition: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_PARTITION, description: 'Explicit partition; overrides the key' })),
    delayMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: 2_147_483_647, description: 'Not pushed before produce time plus this delay' }),
    ),
    idempotencyKey: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 512,
        description: 'A repeat within the topic retention returns the original coordinates and stores nothing',
      }),
    ),
  },
  { $id: 'ProduceMessage', additionalProperties: false },
)

export const ProduceRequest = Type.Object(
  {
    messages: Type.Array(ref(ProduceMessage), { minItems: 1, maxItems: 1000 }),
  },
  { $id: 'ProduceRequest', additionalProperties: false },
)

export const ProduceResult = Type.Object(
  {
    partition: Type.Integer(),
    offset: Type.Integer(),
    duplicate: Type.Optional(Type.Boolean({ description: 'Present (true) when the idempotency key was seen before' })),
  },
  { $id: 'ProduceResult' },
)

export const ProduceResponse = Type.Object(
  {
    results: Type.Array(ref(ProduceResult), { description: 'One per message, in request order' }),
  },
  { $id: 'ProduceResponse' },
)

export const IdempotencyKeysRequest = Type.Object(
  {
    keys: Type.Array(Type.String({ minLength: 1, maxLength: 512 }), { minItems: 1, maxItems: 1000 }),
  },
  { $id: 'IdempotencyKeysRequest', additionalProperties: false },
)

export const IdempotencyKeysResponse = Type.Object(
  {
    keys: Type.Array(
      Type.Object({ key: Type.String(), partition: Type.Integer(), offset: Type.Integer() }, { additionalProperties: false }),
      { description: 'The keys asked for that are stored (within the topic retention), with where their message is; the others are free' },
    ),
  },
  { $id: 'IdempotencyKeysResponse' },
)

export const PartitionParams = Type.Object({
  topic: Type.String({ pattern: NAME_PATTERN }),
  partition: Type.Integer({ minimum: 0, maximum: MAX_PARTITION }),
})

export const FetchQuery = Type.Object(
  {
    fromOffset: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_OFFSET, default: 0 })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  },
  { additionalProperties: false },
)

export const Message = Type.Object(
  {
    partition: Type.Integer(),
    offset: Type.Integer(),
    key: Type.Union([Type.String(), Type.Null()]),
    value: Type.Unknown(),
    headers: Type.Record(Type.String(), Type.String()),
    timestamp: Type.String({ format: 'date-time' }),
  },
  { $id: 'Message' },
)

export const FetchResponse = Type.Object(
  {
    messages: Type.Array(ref(Message)),
    nextOffset: Type.Integer({ description: 'The offset to fetch from next' }),
  },
  { $id: 'FetchResponse' },
)

export const messageSchemas = [
  ProduceMessage,
  ProduceRequest,
  ProduceResult,
  ProduceResponse,
  IdempotencyKeysRequest,
  IdempotencyKeysResponse,
  Message,
  FetchResponse,
]

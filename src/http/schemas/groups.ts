/** Schemas of consumer groups and their consumers. */
import { Type } from 'typebox'
import { BatchSettings, Filter, Group, GroupConfig, RetryPolicy } from '../../core/group-settings.ts'
import { NAME_PATTERN, ref } from './common.ts'
import { RATE_LIMIT_MAX_PER_SECOND, RATE_LIMIT_MIN_PER_SECOND } from '../../core/consumer-limits.ts'

// A group's settings, and so GroupConfig, Group and their components, are built from one table in
// src/core/group-settings.ts, below the service and the CLI, which derive from it too.
export { BatchSettings, Filter, Group, GroupConfig, RetryPolicy }

export const GroupParams = Type.Object({
  group: Type.String({ pattern: NAME_PATTERN, description: 'Group name' }),
})

export const ConsumerParams = Type.Object({
  group: Type.String({ pattern: NAME_PATTERN }),
  id: Type.String({ minLength: 1, maxLength: 64 }),
})

export const GroupList = Type.Object({ groups: Type.Array(ref(Group)) }, { $id: 'GroupList' })

/** A consumer's push authentication as given (contract v1.2 "Push authentication"); its secret values are write-only. */
export const PushAuth = Type.Union(
  [
    Type.Object(
      {
        type: Type.Literal('headers'),
        headers: Type.Record(Type.String(), Type.String({ minLength: 1, maxLength: 8192 }), {
          minProperties: 1,
          maxProperties: 20,
          description:
            'Sent with every push (at most 20); content-type, content-length, host, webhook-* and connection framing headers are refused. Values are write-only',
        }),
      },
      { additionalProperties: false },
    ),
    Type.Object(
      {
        type: Type.Literal('jwt'),
        audience: Type.Optional(
          Type.String({ minLength: 1, maxLength: 2048, description: "The JWT's aud claim; default the consumer's url" }),
        ),
      },
      { additionalProperties: false, description: 'authorization: Bearer <JWT> signed by the broker; keys at /.well-known/jwks.json' },
    ),
    Type.Object(
      {
        type: Type.Literal('oauth2'),
        tokenUrl: Type.String({ minLength: 8, maxLength: 2048, format: 'uri', description: 'Under the push URL policy' }),
        clientId: Type.String({ minLength: 1, maxLength: 1024 }),
        clientSecret: Type.String({ minLength: 1, maxLength: 4096, description: 'Write-only' }),
        scope: Type.Optional(Type.String({ minLength: 1, maxLength: 1024 })),
      },
      { additionalProperties: false, description: 'OAuth 2.0 client credentials; the token is sent as authorization: Bearer' },
    ),
  ],
  { $id: 'PushAuth' },
)

/** What an answer shows of a consumer's push authentication: never a secret value. */
export const PushAuthView = Type.Union(
  [
    Type.Object({ type: Type.Literal('headers'), headerNames: Type.Array(Type.String()) }),
    Type.Object({ type: Type.Literal('jwt'), audience: Type.Union([Type.String(), Type.Null()]) }),
    Type.Object({
      type: Type.Literal('oauth2'),
      tokenUrl: Type.String(),
      clientId: Type.String(),
      scope: Type.Union([Type.String(), Type.Null()]),
    }),
    Type.Null(),
  ],
  { $id: 'PushAuthView', description: 'Push authentication: its type and header names or clientId, never a secret value; null: none' },
)

export const Consumer = Type.Object(
  {
    id: Type.String(),
    url: Type.String(),
    createdAt: Type.String({ format: 'date-time' }),
    disabled: Type.Optional(Type.Boolean({ description: 'true after the endpoint answered 410 Gone' })),
    disabledReason: Type.Optional(Type.Union([Type.String(), Type.Null()])),
    hasSecret: Type.Optional(Type.Boolean({ description: 'Pushes are signed; the secret itself is never returned' })),
    auth: Type.Optional(ref(PushAuthView)),
    rateLimitPerSecond: Type.Union([Type.Number(), Type.Null()], {
      description: 'Pushes started in any one second at most; null: no limit',
    }),
    maxConcurrency: Type.Union([Type.Integer(), Type.Null()], {
      description: 'Pushes in flight at once at most; null: only the adaptive push window',
    }),
  },
  { $id: 'Consumer' },
)

const SECRET_PATTERN = '^whsec_[A-Za-z0-9+/=]{16,256}$'

const consumerUrl = Type.String({ minLength: 8, maxLength: 2048, format: 'uri', description: 'http:// or https:// endpoint' })
const rateLimitPerSecond = Type.Number({
  minimum: RATE_LIMIT_MIN_PER_SECOND,
  maximum: RATE_LIMIT_MAX_PER_SECOND,
  description:
    'At most this many pushes start in any one second (a fraction below 1: one push every 1/n seconds, at least 0.0001: one every 10,000 s); on top of the adaptive push window',
})
const maxConcurrency = Type.Integer({
  minimum: 1,
  maximum: 1000,
  description: 'At most this many pushes in flight at once, a cap on top of the adaptive push window',
})

export const ConsumerCreate = Type.Object(
  {
    url: consumerUrl,
    secret: Type.Optional(
      Type.String({ pattern: SECRET_PATTERN, description: 'Standard Webhooks secret: whsec_ followed by base64 of 24 to 64 random bytes' }),
    ),
    rateLimitPerSecond: Type.Optional(rateLimitPerSecond),
    maxConcurrency: Type.Optional(maxConcurrency),
    auth: Type.Optional(ref(PushAuth)),
  },
  { $id: 'ConsumerCreate', additionalProperties: false },
)

export const ConsumerPatch = Type.Object(
  {
    url: Type.Optional(consumerUrl),
    rateLimitPerSecond: Type.Optional(Type.Union([rateLimitPerSecond, Type.Null()], { description: 'null removes the limit' })),
    maxConcurrency: Type.Optional(Type.Union([maxConcurrency, Type.Null()], { description: 'null removes the cap' })),
    auth: Type.Optional(Type.Union([ref(PushAuth), Type.Null()], { description: 'null removes it' })),
  },
  {
    $id: 'ConsumerPatch',
    additionalProperties: false,
    minProperties: 1,
    description: 'Any of url, rateLimitPerSecond, maxConcurrency, auth; what is not named stays as it is',
  },
)

export const SecretRotation = Type.Object(
  {
    secret: Type.Optional(
      Type.String({
        pattern: SECRET_PATTERN,
        description:
          'The new Standard Webhooks secret (whsec_ followed by base64 of 24 to 64 random bytes); ' +
          'omitted: the broker generates one and returns it in this answer only',
      }),
    ),
    overlapMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 604_800_000,
        description: 'How long the secret being replaced keeps signing pushes, next to the new one; default 86400000 (24 h)',
      }),
    ),
  },
  { $id: 'SecretRotation', additionalProperties: false },
)

export const RotatedConsumer = Type.Object(
  {
    id: Type.String(),
    url: Type.String(),
    createdAt: Type.String({ format: 'date-time' }),
    hasSecret: Type.Boolean(),
    secretRotatedAt: Type.String({ format: 'date-time' }),
    previousSecretExpiresAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'Until then pushes carry a second signature made with the replaced secret; null when there was none',
    }),
    secret: Type.Optional(
      Type.String({ description: 'The generated secret: present only when the broker generated it, and never shown again' }),
    ),
  },
  { $id: 'RotatedConsumer' },
)

export const ConsumerList = Type.Object({ consumers: Type.Array(ref(Consumer)) }, { $id: 'ConsumerList' })

export const PartitionStatus = Type.Object(
  {
    partition: Type.Integer(),
    committedOffset: Type.Integer({ description: 'Every offset below it is completed (acked or dead-lettered)' }),
    endOffset: Type.Integer(),
    lag: Type.Integer({ description: 'endOffset - committedOffset' }),
    inFlight: Type.Integer(),
    consumerId: Type.Union([Type.String(), Type.Null()], { description: 'The consumer this partition is pushed to' }),
    filtered: Type.Integer({
      description: "Messages completed without a push because the group's filter did not match them, since the group was created",
    }),
  },
  { $id: 'PartitionStatus' },
)

export const ConsumerHealth = Type.Object(
  {
    lastSuccessAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], { description: 'The last push it answered 2xx' }),
    lastFailureAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description:
        'The last push that failed: another status, no answer in time, a network error, or (explicit mode) no ack before the deadline',
    }),
    lastError: Type.Union([Type.String(), Type.Null()], { description: 'What that failure was, as the attempt log records it' }),
    recentFailureRate: Type.Union([Type.Number({ minimum: 0, maximum: 1 }), Type.Null()], {
      description: 'Failed pushes / pushes over the last 5 minutes (10-second granularity); null when there was none',
    }),
  },
  { $id: 'ConsumerHealth' },
)

export const ConsumerWithHealth = Type.Object(
  {
    ...Consumer.properties,
    health: ref(ConsumerHealth),
  },
  { $id: 'ConsumerWithHealth' },
)

export const GroupStatus = Type.Object(
  {
    ...Group.properties,
    partitions: Type.Array(ref(PartitionStatus)),
    consumers: Type.Array(ref(ConsumerWithHealth)),
  },
  { $id: 'GroupStatus' },
)

export const groupSchemas = [
  PushAuth,
  PushAuthView,
  Filter,
  BatchSettings,
  RetryPolicy,
  GroupConfig,
  Group,
  GroupList,
  Consumer,
  ConsumerCreate,
  ConsumerPatch,
  ConsumerList,
  SecretRotation,
  RotatedConsumer,
  PartitionStatus,
  ConsumerHealth,
  ConsumerWithHealth,
  GroupStatus,
]

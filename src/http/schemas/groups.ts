/** Schemas of consumer groups and their consumers. */
import { Type } from 'typebox'
import { NAME_PATTERN, ref } from './common.ts'

export const GroupParams = Type.Object({
  group: Type.String({ pattern: NAME_PATTERN, description: 'Group name' }),
})

export const ConsumerParams = Type.Object({
  group: Type.String({ pattern: NAME_PATTERN }),
  id: Type.String({ minLength: 1, maxLength: 64 }),
})

// No `default` keywords in these request schemas: Ajv would fill omitted fields in, and a partial
// PUT of an existing group would then reset every setting it did not mention. Defaults are applied
// by the service on creation (GROUP_DEFAULTS) and named in the descriptions.
export const RetryPolicy = Type.Object(
  {
    initialDelayMs: Type.Optional(Type.Integer({ minimum: 0, maximum: 86_400_000, description: 'Default 1000' })),
    multiplier: Type.Optional(Type.Number({ minimum: 1, maximum: 100, description: 'Default 2' })),
    maxDelayMs: Type.Optional(Type.Integer({ minimum: 0, maximum: 86_400_000, description: 'Default 60000' })),
    jitter: Type.Optional(
      Type.Number({ minimum: 0, maximum: 1, description: 'Spread of each delay, as a fraction: 0.1 (the default) is ±10%' }),
    ),
  },
  {
    $id: 'RetryPolicy',
    additionalProperties: false,
    description: 'Delay before attempt n+1: min(maxDelayMs, initialDelayMs × multiplier^(n-1)), ±jitter',
  },
)

// The filter's grammar is checked by the service (src/dispatch/filter.ts), which names the member at
// fault; the schema says only that it is an object, and describes it for the OpenAPI reader.
export const Filter = Type.Record(Type.String(), Type.Unknown(), {
  $id: 'Filter',
  description:
    'Members that must all match (AND): "key", "headers.<name>" or "value.<a.b.c>" (a path into a JSON object value), ' +
    'each with a condition: a string, number, boolean or null (equal), an array of them (any), {"prefix": "eu-"}, {"exists": true|false}, ' +
    '{"gt"|"gte"|"lt"|"lte": n} (several form a range) or {"not": <condition>}; and "$or": [<filter>, ...], matching when any does. ' +
    'A path that does not exist matches only {"exists": false}.',
  examples: [
    {
      'headers.type': ['order.created', 'order.paid'],
      'value.region': { prefix: 'eu-' },
      $or: [{ 'value.total': { gte: 100 } }, { key: 'vip' }],
    },
  ],
})

export const BatchSettings = Type.Object(
  {
    maxMessages: Type.Integer({ minimum: 1, maximum: 1000, description: 'Messages a push carries at most' }),
    maxWaitMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 10_000,
        description: 'How long a batch waits for more messages after its first is ready; default 0 (the messages ready together)',
      }),
    ),
    maxBytes: Type.Optional(
      Type.Integer({
        minimum: 1024,
        maximum: 16 * 1024 * 1024,
        description: 'A batch is sent before its body would pass this size (a single message larger than it goes alone); default none',
      }),
    ),
  },
  {
    $id: 'BatchSettings',
    additionalProperties: false,
    description:
      'One push carries up to maxMessages messages of a partition as {"deliveries": [<envelope>, ...]}; needs pushFormat "envelope"',
  },
)

const groupFields = {
  topic: Type.String({ pattern: NAME_PATTERN, description: 'The topic consumed; fixed once created' }),
  ackMode: Type.Optional(
    Type.Union([Type.Literal('explicit'), Type.Literal('auto')], {
      description: 'explicit (default): a 2xx means received, ack over HTTP; auto: a 2xx is the ack',
    }),
  ),
  ackTimeoutMs: Type.Optional(Type.Integer({ minimum: 1000, maximum: 43_200_000, description: 'Default 30000' })),
  maxDeliveries: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'Attempts before dead-lettering; default 5' })),
  retry: Type.Optional(ref(RetryPolicy)),
  deadLetterTopic: Type.Optional(Type.Union([Type.String({ pattern: NAME_PATTERN }), Type.Null()])),
  startAt: Type.Optional(
    Type.String({
      description: '"earliest" (default), "latest", or an RFC 3339 date-time (2026-01-01T00:00:00Z): where a new group starts',
    }),
  ),
  maxInFlight: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000, description: 'Per partition; default 100' })),
  ordered: Type.Optional(Type.Boolean({ description: 'The v1 spelling of ordering: true is "partition", false "none"' })),
  ordering: Type.Optional(
    Type.Union([Type.Literal('none'), Type.Literal('partition'), Type.Literal('key')], {
      description:
        'none (default): messages of a partition in parallel up to maxInFlight; partition: one message of a partition ' +
        'outstanding at a time; key: one message per key outstanding at a time, keys in parallel (a message without a key is not ordered)',
    }),
  ),
  pushTimeoutMs: Type.Optional(
    Type.Union([Type.Integer({ minimum: 100, maximum: 600_000 }), Type.Null()], {
      description: 'Default min(10000, ackTimeoutMs), following ackTimeoutMs until set; null returns to the default',
    }),
  ),
  pushFormat: Type.Optional(Type.Union([Type.Literal('envelope'), Type.Literal('raw')], { description: 'Default envelope' })),
  paused: Type.Optional(Type.Boolean({ description: 'Default false' })),
  batch: Type.Optional(
    Type.Union([ref(BatchSettings), Type.Null()], {
      description: 'Batch push; given whole (what it leaves out takes its default); null: one message a push (the default)',
    }),
  ),
  filter: Type.Optional(
    Type.Union([ref(Filter), Type.Null()], {
      description: 'Only matching messages are pushed; the others are completed without a push. null removes it; default none',
    }),
  ),
}

export const GroupConfig = Type.Object(groupFields, { $id: 'GroupConfig', additionalProperties: false })

const resolvedFields = {
  name: Type.String(),
  topic: Type.String(),
  ackMode: Type.Union([Type.Literal('explicit'), Type.Literal('auto')]),
  ackTimeoutMs: Type.Integer(),
  maxDeliveries: Type.Integer(),
  retry: Type.Object({
    initialDelayMs: Type.Integer(),
    multiplier: Type.Number(),
    maxDelayMs: Type.Integer(),
    jitter: Type.Number(),
  }),
  deadLetterTopic: Type.Union([Type.String(), Type.Null()]),
  startAt: Type.String(),
  maxInFlight: Type.Integer(),
  ordered: Type.Boolean({ description: 'true exactly when ordering is "partition"' }),
  ordering: Type.Union([Type.Literal('none'), Type.Literal('partition'), Type.Literal('key')]),
  pushTimeoutMs: Type.Integer(),
  pushFormat: Type.Union([Type.Literal('envelope'), Type.Literal('raw')]),
  paused: Type.Boolean(),
  filter: Type.Union([ref(Filter), Type.Null()]),
  batch: Type.Union([
    Type.Object({ maxMessages: Type.Integer(), maxWaitMs: Type.Integer(), maxBytes: Type.Union([Type.Integer(), Type.Null()]) }),
    Type.Null(),
  ]),
  createdAt: Type.String({ format: 'date-time' }),
  updatedAt: Type.String({ format: 'date-time' }),
}

export const Group = Type.Object(resolvedFields, { $id: 'Group' })

export const GroupList = Type.Object({ groups: Type.Array(ref(Group)) }, { $id: 'GroupList' })

export const Consumer = Type.Object(
  {
    id: Type.String(),
    url: Type.String(),
    createdAt: Type.String({ format: 'date-time' }),
    disabled: Type.Optional(Type.Boolean({ description: 'true after the endpoint answered 410 Gone' })),
    disabledReason: Type.Optional(Type.Union([Type.String(), Type.Null()])),
    hasSecret: Type.Optional(Type.Boolean({ description: 'Pushes are signed; the secret itself is never returned' })),
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
  exclusiveMinimum: 0,
  maximum: 1_000_000,
  description:
    'At most this many pushes start in any one second (a fraction below 1: one push every 1/n seconds); on top of the adaptive push window',
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
  },
  { $id: 'ConsumerCreate', additionalProperties: false },
)

export const ConsumerPatch = Type.Object(
  {
    url: Type.Optional(consumerUrl),
    rateLimitPerSecond: Type.Optional(Type.Union([rateLimitPerSecond, Type.Null()], { description: 'null removes the limit' })),
    maxConcurrency: Type.Optional(Type.Union([maxConcurrency, Type.Null()], { description: 'null removes the cap' })),
  },
  {
    $id: 'ConsumerPatch',
    additionalProperties: false,
    minProperties: 1,
    description: 'Any of url, rateLimitPerSecond, maxConcurrency; what is not named stays as it is',
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
    ...resolvedFields,
    partitions: Type.Array(ref(PartitionStatus)),
    consumers: Type.Array(ref(ConsumerWithHealth)),
  },
  { $id: 'GroupStatus' },
)

export const groupSchemas = [
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

/** Schemas of the topics resource. */
import { Type } from 'typebox'
import { NAME_PATTERN, ref } from './common.ts'

export const TopicParams = Type.Object({
  topic: Type.String({ pattern: NAME_PATTERN, description: 'Topic name' }),
})

export const TopicConfig = Type.Object(
  {
    partitions: Type.Integer({ minimum: 1, maximum: 1024, description: 'Number of partitions; fixed once created' }),
    retentionMs: Type.Optional(
      Type.Integer({
        minimum: 60_000,
        maximum: 3_153_600_000_000,
        description: 'How long messages (and idempotency keys) are kept; default 7 days',
      }),
    ),
  },
  { $id: 'TopicConfig', additionalProperties: false },
)

export const Topic = Type.Object(
  {
    name: Type.String(),
    partitions: Type.Integer(),
    retentionMs: Type.Integer(),
    createdAt: Type.String({ format: 'date-time' }),
  },
  { $id: 'Topic' },
)

export const PartitionStat = Type.Object(
  {
    partition: Type.Integer(),
    endOffset: Type.Integer({ description: 'The next offset to be written' }),
    startOffset: Type.Optional(
      Type.Integer({
        description:
          'The oldest offset kept (retention removes from the front); endOffset when none is. A read or seek below it starts at it.',
      }),
    ),
  },
  { $id: 'PartitionStat' },
)

export const TopicStorage = Type.Object(
  {
    messages: Type.Integer({ description: 'Messages kept, over all partitions' }),
    oldestMessageAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'Produce time of the oldest message kept (null: none)',
    }),
    approxBytes: Type.Integer({
      description: "Disk the topic's messages take, approximately: its share of the messages table, indexes included",
    }),
  },
  { $id: 'TopicStorage' },
)

export const TopicDetail = Type.Object(
  {
    name: Type.String(),
    partitions: Type.Integer(),
    retentionMs: Type.Integer(),
    createdAt: Type.String({ format: 'date-time' }),
    partitionStats: Type.Array(ref(PartitionStat)),
    storage: Type.Optional(ref(TopicStorage)),
  },
  { $id: 'TopicDetail' },
)

export const TopicList = Type.Object(
  {
    topics: Type.Array(ref(Topic)),
  },
  { $id: 'TopicList' },
)

export const topicSchemas = [TopicConfig, Topic, PartitionStat, TopicStorage, TopicDetail, TopicList]

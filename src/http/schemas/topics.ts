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
  },
  { $id: 'PartitionStat' },
)

export const TopicDetail = Type.Object(
  {
    name: Type.String(),
    partitions: Type.Integer(),
    retentionMs: Type.Integer(),
    createdAt: Type.String({ format: 'date-time' }),
    partitionStats: Type.Array(ref(PartitionStat)),
  },
  { $id: 'TopicDetail' },
)

export const TopicList = Type.Object(
  {
    topics: Type.Array(ref(Topic)),
  },
  { $id: 'TopicList' },
)

export const topicSchemas = [TopicConfig, Topic, PartitionStat, TopicDetail, TopicList]

/** Storage of topics and their partitions' end offsets. */
import type { Prisma, PrismaExecutor } from './db.ts'

export interface TopicRow {
  id: number
  name: string
  partitions: number
  retentionMs: number
  createdAt: Date
}

function toRow(t: { id: number; name: string; partitions: number; retentionMs: bigint; createdAt: Date }): TopicRow {
  return { id: t.id, name: t.name, partitions: t.partitions, retentionMs: Number(t.retentionMs), createdAt: t.createdAt }
}

/** Is this a Prisma unique-constraint violation (P2002)? */
function isUniqueViolation(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'P2002'
}

/**
 * Creates the topic and its partition rows (one nested write: Prisma runs it in a transaction, or
 * in the caller's). Returns null when a topic of that name exists already (a concurrent creator won).
 */
export async function createTopic(p: PrismaExecutor, name: string, partitions: number, retentionMs: number): Promise<TopicRow | null> {
  try {
    const topic = await p.topic.create({
      data: {
        name,
        partitions,
        retentionMs: BigInt(retentionMs),
        parts: { createMany: { data: Array.from({ length: partitions }, (_, partition) => ({ partition })) } },
      },
    })
    return toRow(topic)
  } catch (err) {
    if (isUniqueViolation(err)) return null
    throw err
  }
}

/** The topic of that name, or null. */
export async function findTopicByName(p: PrismaExecutor, name: string): Promise<TopicRow | null> {
  const topic = await p.topic.findUnique({ where: { name } })
  return topic ? toRow(topic) : null
}

/** Every topic, by name. */
export async function listTopics(p: PrismaExecutor): Promise<TopicRow[]> {
  const topics = await p.topic.findMany({ orderBy: { name: 'asc' } })
  return topics.map(toRow)
}

/** Sets the retention of an existing topic. */
export async function setTopicRetention(p: PrismaExecutor, id: number, retentionMs: number): Promise<TopicRow> {
  return toRow(await p.topic.update({ where: { id }, data: { retentionMs: BigInt(retentionMs) } }))
}

/**
 * Deletes the topic with its partitions, idempotency keys, and the groups' offsets, completions and
 * attempts on it, in one transaction of its own (the hot tables have no foreign keys to cascade: see
 * prisma/schema.prisma); hence the client, not a transaction's.
 */
export async function deleteTopic(prisma: Prisma, id: number): Promise<boolean> {
  // Its schedules first: a tick locks its schedule's row before the partition rows it appends to,
  // and the cascade from the topic row would lock them the other way round (a deadlock).
  // Its messages are not deleted here, row by row in this transaction: the retention sweep drops its
  // chunks whole (and deletes its rows out of messages_legacy), src/store/message-chunks.ts. Until
  // then nothing reaches them: the topic's id is never reused, and its groups' offsets go here.
  const [, , , , , { count }] = await prisma.$transaction([
    prisma.schedule.deleteMany({ where: { topicId: id } }),
    prisma.idempotencyKey.deleteMany({ where: { topicId: id } }),
    prisma.groupOffset.deleteMany({ where: { topicId: id } }),
    prisma.groupCompletion.deleteMany({ where: { topicId: id } }),
    prisma.delivery.deleteMany({ where: { topicId: id } }),
    prisma.topic.deleteMany({ where: { id } }),
  ])
  return count > 0
}

/** The next offset to be written, per partition, in partition order. */
export async function readEndOffsets(p: PrismaExecutor, topicId: number): Promise<{ partition: number; endOffset: number }[]> {
  const parts = await p.topicPartition.findMany({
    where: { topicId },
    orderBy: { partition: 'asc' },
    select: { partition: true, nextOffset: true },
  })
  return parts.map((p) => ({ partition: p.partition, endOffset: Number(p.nextOffset) }))
}

/** The next offset to be written of every partition of every topic (one statement for all topics). */
export async function readAllEndOffsets(p: PrismaExecutor): Promise<{ topicId: number; partition: number; endOffset: number }[]> {
  const parts = await p.topicPartition.findMany({ select: { topicId: true, partition: true, nextOffset: true } })
  return parts.map((p) => ({ topicId: p.topicId, partition: p.partition, endOffset: Number(p.nextOffset) }))
}

/** Storage of topics and their partitions' end offsets. */
import type { Prisma } from './db.ts'

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

export class TopicStore {
  constructor(private readonly prisma: Prisma) {}

  /**
   * Creates the topic and its partition rows in one transaction. Returns null when a topic of
   * that name exists already (a concurrent creator won).
   */
  async create(name: string, partitions: number, retentionMs: number): Promise<TopicRow | null> {
    try {
      const topic = await this.prisma.topic.create({
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

  async findByName(name: string): Promise<TopicRow | null> {
    const topic = await this.prisma.topic.findUnique({ where: { name } })
    return topic ? toRow(topic) : null
  }

  async list(): Promise<TopicRow[]> {
    const topics = await this.prisma.topic.findMany({ orderBy: { name: 'asc' } })
    return topics.map(toRow)
  }

  /** Sets the retention of an existing topic. */
  async setRetention(id: number, retentionMs: number): Promise<TopicRow> {
    return toRow(await this.prisma.topic.update({ where: { id }, data: { retentionMs: BigInt(retentionMs) } }))
  }

  /**
   * Deletes the topic with its partitions, messages, and the groups' offsets, completions and
   * attempts on it, in one transaction (the hot tables have no foreign keys to cascade: see
   * prisma/schema.prisma).
   */
  async delete(id: number): Promise<boolean> {
    const [, , , , { count }] = await this.prisma.$transaction([
      this.prisma.message.deleteMany({ where: { topicId: id } }),
      this.prisma.groupOffset.deleteMany({ where: { topicId: id } }),
      this.prisma.groupCompletion.deleteMany({ where: { topicId: id } }),
      this.prisma.delivery.deleteMany({ where: { topicId: id } }),
      this.prisma.topic.deleteMany({ where: { id } }),
    ])
    return count > 0
  }

  /** The next offset to be written, per partition, in partition order. */
  async endOffsets(topicId: number): Promise<{ partition: number; endOffset: number }[]> {
    const parts = await this.prisma.topicPartition.findMany({
      where: { topicId },
      orderBy: { partition: 'asc' },
      select: { partition: true, nextOffset: true },
    })
    return parts.map((p) => ({ partition: p.partition, endOffset: Number(p.nextOffset) }))
  }
}

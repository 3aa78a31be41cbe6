/** Storage of consumer groups, their consumers and committed offsets. */
import type { Prisma } from './db.ts'
import type { ConsumerGroup as GroupRow, Consumer as ConsumerRow } from '../generated/prisma/client.ts'

export type { GroupRow, ConsumerRow }

/** The writable settings of a group (all of its columns but identity and timestamps). */
export type GroupSettings = Omit<GroupRow, 'id' | 'name' | 'createdAt' | 'updatedAt'>

export class GroupStore {
  constructor(private readonly prisma: Prisma) {}

  /**
   * Creates the group with its committed offsets, or returns null when the name is taken (the
   * caller then reads and updates it). One transaction: a group never exists without its offsets.
   */
  async create(
    name: string,
    settings: GroupSettings,
    offsets: { topicId: number; partition: number; committedOffset: number }[],
  ): Promise<GroupRow | null> {
    try {
      return await this.prisma.$transaction(async (tx) => {
        const group = await tx.consumerGroup.create({ data: { name, ...settings } })
        await tx.groupOffset.createMany({
          data: offsets.map((o) => ({ ...o, groupId: group.id, committedOffset: BigInt(o.committedOffset) })),
        })
        return group
      })
    } catch (err) {
      if ((err as { code?: string }).code === 'P2002') return null
      throw err
    }
  }

  async update(id: number, settings: Partial<GroupSettings>): Promise<GroupRow> {
    return this.prisma.consumerGroup.update({ where: { id }, data: settings })
  }

  async findByName(name: string): Promise<GroupRow | null> {
    return this.prisma.consumerGroup.findUnique({ where: { name } })
  }

  async list(): Promise<GroupRow[]> {
    return this.prisma.consumerGroup.findMany({ orderBy: { name: 'asc' } })
  }

  /**
   * Deletes the group with its consumers (cascade), offsets, completions and attempts, in one
   * transaction (the hot tables have no foreign keys: see prisma/schema.prisma).
   */
  async delete(id: number): Promise<boolean> {
    const [, , , { count }] = await this.prisma.$transaction([
      this.prisma.groupOffset.deleteMany({ where: { groupId: id } }),
      this.prisma.groupCompletion.deleteMany({ where: { groupId: id } }),
      this.prisma.delivery.deleteMany({ where: { groupId: id } }),
      this.prisma.consumerGroup.deleteMany({ where: { id } }),
    ])
    return count > 0
  }

  /** Committed offsets of the group on a topic, by partition. */
  async committedOffsets(groupId: number, topicId: number): Promise<Map<number, number>> {
    const rows = await this.prisma.groupOffset.findMany({ where: { groupId, topicId }, select: { partition: true, committedOffset: true } })
    return new Map(rows.map((r) => [r.partition, Number(r.committedOffset)]))
  }

  /** Messages the group's filter completed without a push, per partition. */
  async filteredCounts(groupId: number, topicId: number): Promise<Map<number, number>> {
    const rows = await this.prisma.groupOffset.findMany({ where: { groupId, topicId }, select: { partition: true, filtered: true } })
    return new Map(rows.map((r) => [r.partition, Number(r.filtered)]))
  }

  /** Records committed offsets for partitions that have none yet (a topic recreated under the group). */
  async initOffsets(groupId: number, offsets: { topicId: number; partition: number; committedOffset: number }[]): Promise<void> {
    await this.prisma.groupOffset.createMany({
      data: offsets.map((o) => ({ groupId, ...o, committedOffset: BigInt(o.committedOffset) })),
      skipDuplicates: true,
    })
  }

  async addConsumer(
    groupId: number,
    id: string,
    url: string,
    secret: string | null,
    limits: Pick<ConsumerRow, 'rateLimitPerSecond' | 'maxConcurrency'>,
  ): Promise<ConsumerRow> {
    return this.prisma.consumer.create({ data: { id, groupId, url, secret, ...limits } })
  }

  /** Changes a consumer's url or limits; null when the group has no such consumer. */
  async updateConsumer(
    groupId: number,
    id: string,
    changes: Partial<Pick<ConsumerRow, 'url' | 'rateLimitPerSecond' | 'maxConcurrency'>>,
  ): Promise<ConsumerRow | null> {
    const { count } = await this.prisma.consumer.updateMany({ where: { groupId, id }, data: changes })
    return count === 0 ? null : this.prisma.consumer.findFirst({ where: { groupId, id } })
  }

  /**
   * Rotates a consumer's secret in one statement: the current secret (if any) becomes the previous
   * one until `previousExpiresAt`, `secret` the current one. Rotating to the secret already current
   * (a retried request) changes nothing but the rotation time, so the real previous secret is kept.
   * Null when the group has no such consumer.
   */
  async rotateSecret(groupId: number, id: string, secret: string, previousExpiresAt: Date, now: Date): Promise<ConsumerRow | null> {
    const count = await this.prisma.$executeRaw`
      UPDATE consumers SET
        previous_secret = CASE WHEN secret = ${secret} THEN previous_secret ELSE secret END,
        previous_secret_expires_at = CASE WHEN secret = ${secret} THEN previous_secret_expires_at
                                          WHEN secret IS NULL THEN NULL ELSE ${previousExpiresAt} END,
        secret = ${secret},
        secret_rotated_at = ${now}
      WHERE group_id = ${groupId} AND id = ${id}`
    if (count === 0) return null
    return this.prisma.consumer.findFirst({ where: { groupId, id } })
  }

  async consumers(groupId: number): Promise<ConsumerRow[]> {
    return this.prisma.consumer.findMany({ where: { groupId }, orderBy: [{ createdAt: 'asc' }, { id: 'asc' }] })
  }

  async disableConsumer(id: string, reason: string): Promise<void> {
    await this.prisma.consumer.updateMany({ where: { id, disabledAt: null }, data: { disabledAt: new Date(), disabledReason: reason } })
  }

  async removeConsumer(groupId: number, id: string): Promise<boolean> {
    const { count } = await this.prisma.consumer.deleteMany({ where: { groupId, id } })
    return count > 0
  }
}

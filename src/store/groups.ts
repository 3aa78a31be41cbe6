/** Storage of consumer groups, their consumers and committed offsets. */
import type { Prisma, PrismaExecutor, Queryable } from './db.ts'
import { storableText } from './storable.ts'
import type { ConsumerGroup as GroupRow, Consumer as ConsumerRow } from '../generated/prisma/client.ts'

export type { GroupRow, ConsumerRow }

/** The writable settings of a group (all of its columns but identity and timestamps). */
export type GroupSettings = Omit<GroupRow, 'id' | 'name' | 'createdAt' | 'updatedAt'>

/**
 * Creates the group with its committed offsets, or returns null when the name is taken (the
 * caller then reads and updates it). A transaction of its own (a group never exists without its
 * offsets), hence the client, not a transaction's.
 */
export async function createGroup(
  prisma: Prisma,
  name: string,
  settings: GroupSettings,
  offsets: { topicId: number; partition: number; committedOffset: number }[],
): Promise<GroupRow | null> {
  try {
    return await prisma.$transaction(async (tx) => {
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

/** Changes the group's settings. */
export async function updateGroup(p: PrismaExecutor, id: number, settings: Partial<GroupSettings>): Promise<GroupRow> {
  return p.consumerGroup.update({ where: { id }, data: settings })
}

/** The group of that name, or null. */
export async function findGroupByName(p: PrismaExecutor, name: string): Promise<GroupRow | null> {
  return p.consumerGroup.findUnique({ where: { name } })
}

/** Every group, by name. */
export async function listGroups(p: PrismaExecutor): Promise<GroupRow[]> {
  return p.consumerGroup.findMany({ orderBy: { name: 'asc' } })
}

/** Names of the groups consuming a topic (a topic's creation reads them: not every group). */
export async function listGroupNamesOfTopic(p: PrismaExecutor, topic: string): Promise<string[]> {
  const rows = await p.consumerGroup.findMany({ where: { topic }, select: { name: true }, orderBy: { name: 'asc' } })
  return rows.map((r) => r.name)
}

/**
 * Deletes the group with its consumers (cascade), offsets, completions and attempts, in one
 * transaction of its own (the hot tables have no foreign keys: see prisma/schema.prisma), hence the
 * client, not a transaction's.
 */
export async function deleteGroup(prisma: Prisma, id: number): Promise<boolean> {
  const [, , , { count }] = await prisma.$transaction([
    prisma.groupOffset.deleteMany({ where: { groupId: id } }),
    prisma.groupCompletion.deleteMany({ where: { groupId: id } }),
    prisma.delivery.deleteMany({ where: { groupId: id } }),
    prisma.consumerGroup.deleteMany({ where: { id } }),
  ])
  return count > 0
}

/** Committed offsets of the group on a topic, by partition. */
export async function readCommittedOffsets(p: PrismaExecutor, groupId: number, topicId: number): Promise<Map<number, number>> {
  const rows = await p.groupOffset.findMany({ where: { groupId, topicId }, select: { partition: true, committedOffset: true } })
  return new Map(rows.map((r) => [r.partition, Number(r.committedOffset)]))
}

/** Messages the group's filter completed without a push, per partition. */
export async function readFilteredCounts(p: PrismaExecutor, groupId: number, topicId: number): Promise<Map<number, number>> {
  const rows = await p.groupOffset.findMany({ where: { groupId, topicId }, select: { partition: true, filtered: true } })
  return new Map(rows.map((r) => [r.partition, Number(r.filtered)]))
}

/** Records committed offsets for partitions that have none yet (a topic recreated under the group). */
export async function insertMissingOffsets(
  p: PrismaExecutor,
  groupId: number,
  offsets: { topicId: number; partition: number; committedOffset: number }[],
): Promise<void> {
  await p.groupOffset.createMany({
    data: offsets.map((o) => ({ groupId, ...o, committedOffset: BigInt(o.committedOffset) })),
    skipDuplicates: true,
  })
}

/** Adds a consumer to the group. */
export async function insertConsumer(
  p: PrismaExecutor,
  groupId: number,
  id: string,
  url: string,
  secret: string | null,
  limits: Pick<ConsumerRow, 'rateLimitPerSecond' | 'maxConcurrency'>,
  auth: Pick<ConsumerRow, 'auth' | 'authSecret'> = { auth: null, authSecret: null },
): Promise<ConsumerRow> {
  return p.consumer.create({ data: { id, groupId, url, secret, ...limits, ...auth } })
}

/** The group's consumer of that id, or null. */
export async function findConsumer(p: PrismaExecutor, groupId: number, id: string): Promise<ConsumerRow | null> {
  return p.consumer.findFirst({ where: { groupId, id } })
}

/** What a consumer's update may change. */
export type ConsumerChanges = Partial<Pick<ConsumerRow, 'url' | 'rateLimitPerSecond' | 'maxConcurrency' | 'auth' | 'authSecret'>>

/**
 * Changes a consumer's url, limits or auth; null when the group has no such consumer. The changes
 * are computed from the row as it is (`changes(current)`: auth values are sealed for the url they
 * go to) under its row lock, in one transaction: two updates, or an update and a delete, one after
 * the other, never one computed from a row the other has changed meanwhile (that mixed one's url
 * with the other's sealed values, or one's auth names with the other's values).
 */
export async function updateConsumer(
  prisma: Prisma,
  groupId: number,
  id: string,
  changes: (current: ConsumerRow) => ConsumerChanges,
): Promise<ConsumerRow | null> {
  return prisma.$transaction(async (tx) => {
    const locked = await tx.$queryRaw<{ id: string }[]>`SELECT id FROM consumers WHERE group_id = ${groupId} AND id = ${id} FOR UPDATE`
    if (locked.length === 0) return null
    const current = await tx.consumer.findFirst({ where: { groupId, id } })
    if (!current) return null
    return tx.consumer.update({ where: { id }, data: changes(current) })
  })
}

/**
 * Rotates a consumer's secret in one statement: the current secret (if any) becomes the previous
 * one until `previousExpiresAt`, `secret` the current one. Rotating to the secret already current
 * (a retried request) changes nothing but the rotation time, so the real previous secret is kept:
 * the caller passes the stored value itself then (a sealed secret is sealed anew on every write).
 * Null when the group has no such consumer; the row is read back by a second statement.
 */
export async function rotateConsumerSecret(
  p: PrismaExecutor,
  groupId: number,
  id: string,
  secret: string,
  previousExpiresAt: Date,
  now: Date,
): Promise<ConsumerRow | null> {
  const count = await p.$executeRaw`
    UPDATE consumers SET
      previous_secret = CASE WHEN secret = ${secret} THEN previous_secret ELSE secret END,
      previous_secret_expires_at = CASE WHEN secret = ${secret} THEN previous_secret_expires_at
                                        WHEN secret IS NULL THEN NULL ELSE ${previousExpiresAt} END,
      secret = ${secret},
      secret_rotated_at = ${now}
    WHERE group_id = ${groupId} AND id = ${id}`
  if (count === 0) return null
  return p.consumer.findFirst({ where: { groupId, id } })
}

/** The group's consumers, oldest first. */
export async function listConsumers(p: PrismaExecutor, groupId: number): Promise<ConsumerRow[]> {
  return p.consumer.findMany({ where: { groupId }, orderBy: [{ createdAt: 'asc' }, { id: 'asc' }] })
}

/** Every group's consumers, oldest first (one statement for all groups: reconciliation reads them all). */
export async function listAllConsumers(p: PrismaExecutor): Promise<ConsumerRow[]> {
  return p.consumer.findMany({ orderBy: [{ createdAt: 'asc' }, { id: 'asc' }] })
}

/** Marks a consumer disabled with the reason (kept from the first time when already disabled). */
export async function disableConsumer(p: PrismaExecutor, id: string, reason: string): Promise<void> {
  await p.consumer.updateMany({ where: { id, disabledAt: null }, data: { disabledAt: new Date(), disabledReason: storableText(reason) } })
}

/** Removes a consumer of the group; false when it has none of that id. */
export async function deleteConsumer(p: PrismaExecutor, groupId: number, id: string): Promise<boolean> {
  const { count } = await p.consumer.deleteMany({ where: { groupId, id } })
  return count > 0
}

/** One group partition's lag: end offset minus committed offset. */
export interface PartitionLag {
  groupId: number
  group: string
  partition: number
  lag: number
}

/**
 * The lag of every group partition, in one statement (the metrics gauges read it for all groups at
 * once). A partition the group has no committed offset for yet (its dispatcher creates it) is left
 * out rather than guessed.
 */
export async function readAllLags(q: Queryable): Promise<PartitionLag[]> {
  const { rows } = await q.query<PartitionLag>(
    `SELECT g.id AS "groupId", g.name AS "group", tp.partition, GREATEST(0, tp.next_offset - o.committed_offset) AS lag
       FROM consumer_groups g
       JOIN topics t ON t.name = g.topic
       JOIN topic_partitions tp ON tp.topic_id = t.id
       JOIN group_offsets o ON o.group_id = g.id AND o.topic_id = t.id AND o.partition = tp.partition
      ORDER BY g.name, tp.partition`,
  )
  return rows
}

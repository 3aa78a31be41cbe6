/** The rules for topics: idempotent creation, lookups cached for the produce path, deletion. */
import { HookqError } from '../core/errors.ts'
import type { Database } from '../store/db.ts'
import { partitionStarts, tableSizes, topicStorage } from '../store/storage.ts'
import { createTopic, deleteTopic, findTopicByName, listTopics, setTopicRetention, type TopicRow } from '../store/topics.ts'

export const DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000

export interface TopicView {
  name: string
  partitions: number
  retentionMs: number
  createdAt: string
}

export function topicView(t: TopicRow): TopicView {
  return { name: t.name, partitions: t.partitions, retentionMs: t.retentionMs, createdAt: t.createdAt.toISOString() }
}

export class TopicService {
  // name → row. Produce looks its topic up on every call; a topic's id and partition count never
  // change, so a cached row can only be stale by the topic having been deleted, which the append
  // notices (its partition rows are gone) and answers by evicting the entry.
  private readonly cache = new Map<string, TopicRow>()

  private readonly listeners = new Set<(event: { created?: TopicRow; deleted?: TopicRow }) => Promise<void>>()

  constructor(private readonly db: Database) {}

  /** Registers a listener told (and awaited) after a topic is created or deleted. */
  onChange(listener: (event: { created?: TopicRow; deleted?: TopicRow }) => Promise<void>): void {
    this.listeners.add(listener)
  }

  private async changed(event: { created?: TopicRow; deleted?: TopicRow }): Promise<void> {
    for (const listener of this.listeners) await listener(event)
  }

  /** Creates the topic, or confirms it exists with the same partition count (retention may change). */
  async put(name: string, partitions: number, retentionMs = DEFAULT_RETENTION_MS): Promise<{ topic: TopicRow; created: boolean }> {
    for (;;) {
      const existing = await findTopicByName(this.db.prisma, name)
      if (existing) {
        if (existing.partitions !== partitions) {
          throw new HookqError(
            'topic_conflict',
            `topic ${name} exists with ${existing.partitions} partitions; the partition count of a topic cannot change`,
          )
        }
        const topic = existing.retentionMs === retentionMs ? existing : await setTopicRetention(this.db.prisma, existing.id, retentionMs)
        this.cache.set(name, topic)
        return { topic, created: false }
      }
      const created = await createTopic(this.db.prisma, name, partitions, retentionMs)
      if (created) {
        this.cache.set(name, created)
        await this.changed({ created })
        return { topic: created, created: true }
      }
      // Lost a race with a concurrent creator: read theirs and compare.
    }
  }

  /** The topic, or 404. Served from the cache when possible. */
  async require(name: string): Promise<TopicRow> {
    const cached = this.cache.get(name)
    if (cached) return cached
    const topic = await findTopicByName(this.db.prisma, name)
    if (!topic) throw new HookqError('topic_not_found', `topic ${name} does not exist`)
    this.cache.set(name, topic)
    return topic
  }

  /** Fresh from the database (never the cache), for reads that must see deletions at once. */
  async requireFresh(name: string): Promise<TopicRow> {
    this.cache.delete(name)
    return this.require(name)
  }

  async list(): Promise<TopicRow[]> {
    return listTopics(this.db.prisma)
  }

  /**
   * The topic with its partitions' offsets (oldest kept and end) and the storage its messages take:
   * a few index probes (see src/store/storage.ts), its share of the table's size taken from every
   * topic's messages kept.
   */
  async describe(name: string): Promise<{
    topic: TopicRow
    partitionStats: { partition: number; startOffset: number; endOffset: number }[]
    storage: { messages: number; oldestMs: number | null; approxBytes: number }
  }> {
    const topic = await this.requireFresh(name)
    const [tables, parts] = await Promise.all([tableSizes(this.db.pool), partitionStarts(this.db.pool)])
    const messagesBytes = tables.find((t) => t.table === 'messages')?.bytes ?? 0
    const mine = parts.filter((p) => p.topicId === topic.id)
    const [storage] = topicStorage(parts, new Map([[topic.id, topic.name]]), messagesBytes)
    return {
      topic,
      partitionStats: mine.map((p) => ({ partition: p.partition, startOffset: p.startOffset, endOffset: p.endOffset })),
      storage: { messages: storage?.messages ?? 0, oldestMs: storage?.oldestMs ?? null, approxBytes: storage?.approxBytes ?? 0 },
    }
  }

  /** Deletes the topic with its messages; 404 when it does not exist. */
  async delete(name: string): Promise<void> {
    const topic = await this.requireFresh(name)
    this.cache.delete(name)
    if (!(await deleteTopic(this.db.prisma, topic.id))) {
      throw new HookqError('topic_not_found', `topic ${name} does not exist`)
    }
    await this.changed({ deleted: topic })
  }

  /** Drops a cached row found stale by a writer. */
  evict(name: string): void {
    this.cache.delete(name)
  }
}

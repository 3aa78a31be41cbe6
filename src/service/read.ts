/** Reading a partition in offset order (pull and inspection). */
import { HookqError } from '../errors.ts'
import type { Database } from '../store/db.ts'
import { readMessages, storedIdempotencyKeys } from '../store/messages.ts'
import type { TopicService } from './topics.ts'

export interface MessageView {
  partition: number
  offset: number
  key: string | null
  value: unknown
  headers: Record<string, string>
  timestamp: string
}

export class ReadService {
  constructor(
    private readonly topics: TopicService,
    private readonly db: Database,
  ) {}

  /**
   * The idempotency keys of `keys` that a produce to the topic would answer as duplicates, and
   * where their messages are: what a dry run (a dead-letter replay's) needs to say truthfully.
   */
  async storedIdempotencyKeys(topicName: string, keys: string[]): Promise<{ key: string; partition: number; offset: number }[]> {
    const topic = await this.topics.requireFresh(topicName)
    return storedIdempotencyKeys(this.db.pool, topic.id, keys)
  }

  /** Up to `limit` messages from `fromOffset`, and the offset to continue from. */
  async fetch(
    topicName: string,
    partition: number,
    fromOffset: number,
    limit: number,
  ): Promise<{ messages: MessageView[]; nextOffset: number }> {
    const topic = await this.topics.requireFresh(topicName)
    if (partition >= topic.partitions) {
      throw new HookqError(
        'partition_not_found',
        `topic ${topicName} has ${topic.partitions} partitions (0 to ${topic.partitions - 1}); there is no partition ${partition}`,
      )
    }
    const rows = await readMessages(this.db.prisma, topic.id, partition, fromOffset, limit)
    const messages = rows.map((r) => ({
      partition: r.partition,
      offset: r.offset,
      key: r.key,
      value: JSON.parse(r.value) as unknown,
      headers: JSON.parse(r.headers) as Record<string, string>,
      timestamp: r.timestamp.toISOString(),
    }))
    const last = messages.at(-1)
    return { messages, nextOffset: last ? last.offset + 1 : fromOffset }
  }
}

/** Reading a partition in offset order (pull and inspection). */
import { HookqError } from '../core/errors.ts'
import type { Database } from '../store/db.ts'
import { readMessages, storedIdempotencyKeys } from '../store/messages.ts'
import type { TopicService } from './topics.ts'

/**
 * A message as read: `value` and `headers` are the stored JSON text, not parsed. A value is parsed
 * by no one on the way out: the answer splices the text in (src/http/fetch-body.ts). Parsing and
 * serialising it again cost time per message, and a value nested thousands deep (hookq_produce()
 * took one before it checked nesting) overflowed the serialiser's stack: every read of its
 * partition answered 500.
 */
export interface MessageText {
  partition: number
  offset: number
  key: string | null
  /** JSON text */
  value: string
  /** JSON text of an object of strings */
  headers: string
  timestamp: string
}

/** Values, headers and keys one page holds at most past its first message. */
const PAGE_BYTES = 16 * 1024 * 1024

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

  /**
   * Up to `limit` messages from `fromOffset`, and the offset to continue from; fewer when the page
   * would pass 16 MiB (one message at least, however large).
   */
  async fetch(
    topicName: string,
    partition: number,
    fromOffset: number,
    limit: number,
  ): Promise<{ messages: MessageText[]; nextOffset: number }> {
    const topic = await this.topics.requireFresh(topicName)
    if (partition >= topic.partitions) {
      throw new HookqError(
        'partition_not_found',
        `topic ${topicName} has ${topic.partitions} partitions (0 to ${topic.partitions - 1}); there is no partition ${partition}`,
      )
    }
    const rows = await readMessages(this.db.pool, topic.id, partition, fromOffset, limit, PAGE_BYTES)
    const messages = rows.map((r) => ({
      partition: r.partition,
      offset: r.offset,
      key: r.key,
      value: r.value,
      headers: r.headers,
      timestamp: r.timestamp.toISOString(),
    }))
    const last = messages.at(-1)
    return { messages, nextOffset: last ? last.offset + 1 : fromOffset }
  }
}

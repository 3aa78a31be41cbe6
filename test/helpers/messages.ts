/** Messages for tests that append through the store directly (src/store/messages.ts), not through produce. */
import type { AppendEntry } from '../../src/store/messages.ts'

/** An entry to append: the value as JSON text; no key, headers, delay or idempotency key unless `extra` gives them. */
export function appendEntry(topicId: number, partition: number, value: string, extra: Partial<AppendEntry> = {}): AppendEntry {
  return { topicId, partition, key: null, value: JSON.stringify(value), headers: '{}', delayMs: 0, idempotencyKey: null, ...extra }
}

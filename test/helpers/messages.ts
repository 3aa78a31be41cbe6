/** Messages for tests that append through the store directly (src/store/messages.ts), not through produce. */
import type { AppendEntry } from '../../src/store/messages.ts'

/** The trace fields of a message produced without a trace context (any fixed id will do in these tests). */
export const NO_TRACE = { traceId: '0af7651916cd43dd8448eb211c80319c', traceparent: null, tracestate: null }

/** An entry to append: the value as JSON text; no key, headers, delay or idempotency key unless `extra` gives them. */
export function appendEntry(topicId: number, partition: number, value: string, extra: Partial<AppendEntry> = {}): AppendEntry {
  return {
    topicId,
    partition,
    key: null,
    value: JSON.stringify(value),
    headers: '{}',
    delayMs: 0,
    idempotencyKey: null,
    ...NO_TRACE,
    ...extra,
  }
}

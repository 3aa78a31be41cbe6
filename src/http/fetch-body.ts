/**
 * The body of GET .../messages, written by hand: each message's stored JSON text (value, headers)
 * is spliced in as it is, never parsed and serialised again. That holds for any value stored,
 * however deep (JSON.stringify overflows its stack near 5,000 levels) and however large, and the
 * text is what the producer sent, as pushes carry it. The other fields are ours (numbers, an ISO
 * time, a key string). The shape is FetchResponse's (src/http/schemas/messages.ts).
 */
import type { MessageText } from '../service/read.ts'

export function fetchBody(page: { messages: MessageText[]; nextOffset: number }): string {
  const parts: string[] = []
  for (const m of page.messages) {
    parts.push(
      `{"partition":${m.partition},"offset":${m.offset},"key":${m.key === null ? 'null' : JSON.stringify(m.key)},` +
        `"value":${m.value},"headers":${m.headers},"timestamp":${JSON.stringify(m.timestamp)}}`,
    )
  }
  return `{"messages":[${parts.join(',')}],"nextOffset":${page.nextOffset}}`
}

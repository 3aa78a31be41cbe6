/** A message as the dispatcher pushes it: value and headers still as stored JSON text. */
export interface DispatchMessage {
  offset: number
  key: string | null
  value: string
  headers: string
  /** The produce time, epoch ms (timestamptz(3): whole milliseconds). */
  producedAtMs: number
  availableAtMs: number
  /** The message's W3C trace (see src/core/trace-context.ts MessageTrace). */
  traceId: string
  traceparent: string | null
  tracestate: string | null
}

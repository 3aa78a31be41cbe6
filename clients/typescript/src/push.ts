/**
 * A push from the broker as one typed message, whichever format the group uses:
 *
 *   envelope   the body is `{ deliveryId, topic, group, partition, offset, key, value, headers,
 *              attempt, timestamp, ackDeadline }`
 *   raw        the body is the message value itself; the rest travels in `hookq-*` headers
 *              (`hookq-topic`, `-group`, `-partition`, `-offset`, `-delivery-id`, `-attempt`,
 *              `-timestamp`, `-ack-deadline`, and `-key` / `-headers` as JSON when set)
 *
 * Both carry `webhook-id`: the same for every attempt of one message. A raw push is recognised by
 * its `hookq-topic` header, which envelope pushes do not have.
 */
import { headerValue, type HeaderSource } from './verify.ts'

/** One delivery attempt of one message. */
export interface PushMessage<T = unknown> {
  /** Names this attempt; what acks, nacks and extends take. */
  deliveryId: string
  /** The same for every attempt of the message: the key to deduplicate on. */
  webhookId: string
  topic: string
  group: string
  partition: number
  offset: number
  key: string | null
  /** The produced value, parsed from JSON. */
  value: T
  headers: Record<string, string>
  /** 1 for the first push, then counting redeliveries. */
  attempt: number
  /** When the message was produced. */
  timestamp: Date
  /** In explicit ack mode, when the broker gives up waiting for the ack and pushes again. */
  ackDeadline: Date
  format: 'envelope' | 'raw'
  /**
   * W3C trace context of this attempt (brokers from v1.2): the message's trace id with a span id of
   * the attempt's own, and the producer's tracestate. Pass both to your propagator's extract().
   */
  traceparent?: string
  tracestate?: string
}

/** A push that cannot be read as a hookq message: answer 400 and do not run anything for it. */
export class PushParseError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'PushParseError'
  }
}

/** What a push arrived with. */
export interface RawPush {
  headers: HeaderSource
  /** The body as received. */
  body: string | Uint8Array
}

/** Reads a push in either format; throws a PushParseError naming the first thing wrong. */
export function parsePush<T = unknown>({ headers, body }: RawPush): PushMessage<T> {
  const webhookId = headerValue(headers, 'webhook-id')
  if (!webhookId) throw new PushParseError('the webhook-id header is missing')
  const text = typeof body === 'string' ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8')
  const value = json(text, 'the body')
  return headerValue(headers, 'hookq-topic') !== undefined ? fromRaw<T>(headers, webhookId, value) : fromEnvelope<T>(webhookId, value)
}

/** A push as it arrived: one message, or a batch of them. */
export interface ParsedPush<T = unknown> {
  /** A batch push (`{"deliveries": [...]}`, a group with `batch` set): its webhook-id names the batch. */
  batch: boolean
  webhookId: string
  /** The message, or the batch's messages in the order they came (offset order). */
  messages: PushMessage<T>[]
}

/**
 * Reads a push of either kind. A batch's messages have no webhook-id of their own on the wire;
 * each gets `<topic>/<partition>/<offset>`, the same for every attempt of the message (what the
 * idempotency store keys on). Throws a PushParseError naming the first thing wrong.
 */
export function parsePushes<T = unknown>({ headers, body }: RawPush): ParsedPush<T> {
  const webhookId = headerValue(headers, 'webhook-id')
  if (!webhookId) throw new PushParseError('the webhook-id header is missing')
  const text = typeof body === 'string' ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8')
  const value = json(text, 'the body')
  if (headerValue(headers, 'hookq-topic') === undefined && typeof value === 'object' && value !== null && 'deliveries' in value) {
    const list = (value as { deliveries: unknown }).deliveries
    if (!Array.isArray(list) || list.length === 0) throw new PushParseError('deliveries must be a non-empty array of envelopes')
    const messages = list.map((e, i) => {
      try {
        const m = fromEnvelope<T>('', e)
        return { ...m, webhookId: `${m.topic}/${m.partition}/${m.offset}` }
      } catch (err) {
        throw new PushParseError(`deliveries[${i}]: ${(err as Error).message}`)
      }
    })
    return { batch: true, webhookId, messages }
  }
  const message =
    headerValue(headers, 'hookq-topic') !== undefined ? fromRaw<T>(headers, webhookId, value) : fromEnvelope<T>(webhookId, value)
  return { batch: false, webhookId, messages: [message] }
}

function fromEnvelope<T>(webhookId: string, body: unknown): PushMessage<T> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new PushParseError('the envelope is not a JSON object')
  const e = body as Record<string, unknown>
  if (!('value' in e)) throw new PushParseError('the envelope has no value')
  return {
    deliveryId: text(e.deliveryId, 'deliveryId'),
    webhookId,
    topic: text(e.topic, 'topic'),
    group: text(e.group, 'group'),
    partition: count(e.partition, 'partition'),
    offset: count(e.offset, 'offset'),
    key: e.key === null || e.key === undefined ? null : keyText(e.key, 'key'),
    value: e.value as T,
    headers: stringMap(e.headers ?? {}, 'headers'),
    attempt: count(e.attempt, 'attempt'),
    timestamp: date(e.timestamp, 'timestamp'),
    ackDeadline: date(e.ackDeadline, 'ackDeadline'),
    format: 'envelope',
    ...traceOf(e.traceparent, e.tracestate),
  }
}

/** The trace fields, present only when the push carries them (an empty tracestate is none). */
function traceOf(traceparent: unknown, tracestate: unknown): { traceparent?: string; tracestate?: string } {
  if (typeof traceparent !== 'string') return {}
  return typeof tracestate === 'string' && tracestate !== '' ? { traceparent, tracestate } : { traceparent }
}

function fromRaw<T>(headers: HeaderSource, webhookId: string, value: unknown): PushMessage<T> {
  const h = (name: string) => headerValue(headers, `hookq-${name}`)
  const key = h('key')
  const messageHeaders = h('headers')
  return {
    deliveryId: text(h('delivery-id'), 'hookq-delivery-id'),
    webhookId,
    topic: text(h('topic'), 'hookq-topic'),
    group: text(h('group'), 'hookq-group'),
    partition: count(numeric(h('partition')), 'hookq-partition'),
    offset: count(numeric(h('offset')), 'hookq-offset'),
    // Key and headers are JSON with non-ASCII escaped, so any string survives an HTTP header.
    key: key === undefined ? null : keyText(json(key, 'hookq-key'), 'hookq-key'),
    value: value as T,
    headers: messageHeaders === undefined ? {} : stringMap(json(messageHeaders, 'hookq-headers'), 'hookq-headers'),
    attempt: count(numeric(h('attempt')), 'hookq-attempt'),
    timestamp: date(h('timestamp'), 'hookq-timestamp'),
    ackDeadline: date(h('ack-deadline'), 'hookq-ack-deadline'),
    format: 'raw',
    ...traceOf(headerValue(headers, 'traceparent'), headerValue(headers, 'tracestate')),
  }
}

function json(source: string, what: string): unknown {
  try {
    return JSON.parse(source)
  } catch {
    throw new PushParseError(`${what} is not JSON`)
  }
}

function text(v: unknown, what: string): string {
  if (typeof v !== 'string' || v === '') throw new PushParseError(`${what} must be a non-empty string`)
  return v
}

/** A key may be any string, the empty one included. */
function keyText(v: unknown, what: string): string {
  if (typeof v !== 'string') throw new PushParseError(`${what} must be a string or null`)
  return v
}

function numeric(v: string | undefined): unknown {
  return v !== undefined && /^\d{1,16}$/.test(v) ? Number(v) : v
}

function count(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw new PushParseError(`${what} must be a whole number ≥ 0`)
  return v
}

function date(v: unknown, what: string): Date {
  const d = typeof v === 'string' ? new Date(v) : undefined
  if (!d || Number.isNaN(d.getTime())) throw new PushParseError(`${what} must be an ISO-8601 timestamp`)
  return d
}

function stringMap(v: unknown, what: string): Record<string, string> {
  if (typeof v !== 'object' || v === null || Array.isArray(v) || Object.values(v).some((x) => typeof x !== 'string')) {
    throw new PushParseError(`${what} must be an object of strings`)
  }
  return v as Record<string, string>
}

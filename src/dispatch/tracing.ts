/**
 * OpenTelemetry spans of a message's life, after the messaging semantic conventions
 * (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/):
 *
 *   produce call        `send <topic>`          PRODUCER  operation.type send, parent: the call's traceparent
 *   each push attempt   `push <topic>`          CLIENT    operation.type send; its span id is the attempt's traceparent
 *   ack, nack           `ack|nack <topic>`      CLIENT    operation.type settle
 *   dead letter         `dead_letter <topic>`   PRODUCER  operation.type send, to the dead-letter topic
 *
 * Push, settle and dead-letter spans are children of the message's creation context (its stored
 * traceparent). A trace hookq began has no producer span: its spans hang from a remote parent made
 * of the trace id, so every attempt still lands in the message's own trace.
 *
 * With no SDK registered (the default) `@opentelemetry/api` is a no-op, and hookq does not even
 * build attributes: each entry point first asks activeTracer(), one global lookup and a compare.
 * Enabling export: docs/tracing.md.
 */
import {
  context,
  ProxyTracerProvider,
  type Span,
  type SpanContext,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  type TracerProvider,
  trace,
  TraceFlags,
  createTraceState,
  type Link,
} from '@opentelemetry/api'
import { webhookId } from './envelope.ts'
import { attemptTraceparent, newSpanId, type CallTrace, type MessageTrace } from '../core/trace-context.ts'

// Semantic convention attribute names (semconv 1.x messaging and HTTP), kept here rather than
// depending on @opentelemetry/semantic-conventions for a dozen strings.
const SYSTEM = 'messaging.system'
const OPERATION_TYPE = 'messaging.operation.type'
const OPERATION_NAME = 'messaging.operation.name'
const DESTINATION = 'messaging.destination.name'
const PARTITION = 'messaging.destination.partition.id'
const GROUP = 'messaging.consumer.group.name'
const MESSAGE_ID = 'messaging.message.id'
const BATCH_COUNT = 'messaging.batch.message_count'
const STATUS_CODE = 'http.response.status_code'
const ERROR_TYPE = 'error.type'
const SERVER_ADDRESS = 'server.address'
const SERVER_PORT = 'server.port'
/** hookq's own: the attempt's number (1 for the first push), and how it ended. */
const ATTEMPT = 'hookq.attempt'
const OUTCOME = 'hookq.push.outcome'

/** The provider every ProxyTracerProvider delegates to before an SDK is registered. */
const NOOP_PROVIDER = new ProxyTracerProvider().getDelegate()
let cachedProvider: TracerProvider | undefined
let cachedTracer: Tracer | undefined

/** hookq's tracer, or undefined when no SDK is registered (then no span is made at all). */
export function activeTracer(): Tracer | undefined {
  const global = trace.getTracerProvider()
  const provider = global instanceof ProxyTracerProvider ? global.getDelegate() : global
  if (provider === NOOP_PROVIDER) return undefined
  if (provider !== cachedProvider) {
    cachedProvider = provider
    cachedTracer = provider.getTracer('hookq')
  }
  return cachedTracer
}

/** The message's creation context as a remote parent: its stored traceparent, or one made of its trace id alone. */
function parentOf(msg: MessageTrace): SpanContext {
  const tp = msg.traceparent
  const ctx: SpanContext =
    tp === null
      ? // No producer span: a remote parent named by the trace id's low half (never all zero for a random id).
        { traceId: msg.traceId, spanId: syntheticSpanId(msg.traceId), traceFlags: TraceFlags.SAMPLED, isRemote: true }
      : { traceId: msg.traceId, spanId: tp.slice(36, 52), traceFlags: Number.parseInt(tp.slice(53, 55), 16), isRemote: true }
  if (msg.tracestate !== null) ctx.traceState = createTraceState(msg.tracestate)
  return ctx
}

function syntheticSpanId(traceId: string): string {
  const low = traceId.slice(16)
  return low === '0000000000000000' ? traceId.slice(0, 16) : low
}

function childOf(parent: SpanContext) {
  return trace.setSpanContext(context.active(), parent)
}

/** Spans a produce call records; end() once it is committed or failed. */
export interface ProduceSpan {
  end(error?: unknown): void
}

/** Links from the produce span to messages with a context of their own, at most this many. */
const MAX_LINKS = 32

/**
 * The span of a produce call (undefined when tracing is off): a child of the call's traceparent,
 * linked to the messages that came with a context of their own.
 */
export function startProduce(topic: string, call: CallTrace | null, messages: readonly MessageTrace[]): ProduceSpan | undefined {
  const tracer = activeTracer()
  if (!tracer) return undefined
  const parent = call === null ? undefined : parentOf({ traceId: call.traceparent.slice(3, 35), ...call })
  const links: Link[] = []
  for (const m of messages) {
    if (links.length >= MAX_LINKS) break
    if (m.traceparent !== null && m.traceparent !== call?.traceparent) links.push({ context: parentOf(m) })
  }
  const span = tracer.startSpan(
    `send ${topic}`,
    {
      kind: SpanKind.PRODUCER,
      attributes: {
        [SYSTEM]: 'hookq',
        [OPERATION_TYPE]: 'send',
        [OPERATION_NAME]: 'produce',
        [DESTINATION]: topic,
        ...(messages.length > 1 ? { [BATCH_COUNT]: messages.length } : {}),
      },
      links,
      ...(parent ? {} : { root: true }),
    },
    parent ? childOf(parent) : undefined,
  )
  return { end: (error) => endSpan(span, error) }
}

function endSpan(span: Span, error?: unknown): void {
  if (error !== undefined) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) })
    span.setAttribute(ERROR_TYPE, error instanceof Error ? error.name : 'error')
  }
  span.end()
}

/** Push spans open (sent, answer awaited), by delivery id; only ever filled while tracing is on. */
const openPushes = new Map<string, Span>()
/** A bound on open push spans: a leak (an attempt never answered) cannot grow without end. */
const MAX_OPEN_PUSHES = 100_000

/**
 * The `traceparent` of a push attempt: the message's trace id and a span id of the attempt's own.
 * With tracing on, that span id is a recorded `push` span's, ended by attemptEnded. Flat
 * arguments: a push with tracing off allocates nothing here but the traceparent.
 */
export function startAttempt(
  msg: MessageTrace & { offset: number },
  deliveryId: string,
  attempt: number,
  topic: { id: number; name: string },
  groupName: string,
  partition: number,
  url: string,
): string {
  const tracer = activeTracer()
  if (!tracer) return attemptTraceparent(msg, newSpanId())
  const span = startAttemptSpan(tracer, 'push', 'send', msg, attempt, topic, groupName, partition, serverOf(url))
  if (openPushes.size >= MAX_OPEN_PUSHES) {
    const [oldest, s] = openPushes.entries().next().value as [string, Span]
    openPushes.delete(oldest)
    s.end()
  }
  openPushes.set(deliveryId, span)
  return traceparentOf(span)
}

/** A span of one attempt (a push or a lease) in the message's trace, a child of its creation context. */
function startAttemptSpan(
  tracer: Tracer,
  operation: 'push' | 'pull',
  type: 'send' | 'receive',
  msg: MessageTrace & { offset: number },
  attempt: number,
  topic: { id: number; name: string },
  groupName: string,
  partition: number,
  extra: Record<string, string | number> = {},
): Span {
  return tracer.startSpan(
    `${operation} ${topic.name}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        [SYSTEM]: 'hookq',
        [OPERATION_TYPE]: type,
        [OPERATION_NAME]: operation,
        [DESTINATION]: topic.name,
        [GROUP]: groupName,
        [PARTITION]: String(partition),
        [MESSAGE_ID]: webhookId(topic.id, partition, msg.offset),
        [ATTEMPT]: attempt,
        ...extra,
      },
    },
    childOf(parentOf(msg)),
  )
}

/** The traceparent that names `span`. */
function traceparentOf(span: Span): string {
  const sc = span.spanContext()
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & TraceFlags.SAMPLED) === 1 ? '01' : '00'}`
}

function serverOf(url: string): Record<string, string | number> {
  try {
    const u = new URL(url)
    return { [SERVER_ADDRESS]: u.hostname, [SERVER_PORT]: Number(u.port || (u.protocol === 'https:' ? 443 : 80)) }
  } catch {
    return {}
  }
}

/**
 * The `traceparent` of a pull lease (an attempt handed to a caller of pull): the message's trace id
 * and a span id of the attempt's own. With tracing on, that span id is a `pull` span's (operation
 * type `receive`), ended at once: the lease is handed over in this call, and what follows (the
 * ack, nack or the deadline) is recorded as for a push.
 */
export function leaseAttempt(
  msg: MessageTrace & { offset: number },
  attempt: number,
  topic: { id: number; name: string },
  groupName: string,
  partition: number,
): string {
  const tracer = activeTracer()
  if (!tracer) return attemptTraceparent(msg, newSpanId())
  const span = startAttemptSpan(tracer, 'pull', 'receive', msg, attempt, topic, groupName, partition)
  span.end()
  return traceparentOf(span)
}

/** How a push attempt ended, as the span records it (PushResult's shape, without importing the pusher). */
export type AttemptEnd =
  | { kind: 'delivered'; status: number }
  | { kind: 'rejected'; status: number }
  | { kind: 'timeout' | 'network' }
  | { kind: 'not_sent' }

/** Ends the push span of `deliveryId` (if one is open) with the attempt's outcome and status code. */
export function attemptEnded(deliveryId: string, end: AttemptEnd): void {
  if (openPushes.size === 0) return
  const span = openPushes.get(deliveryId)
  if (!span) return
  openPushes.delete(deliveryId)
  span.setAttribute(OUTCOME, end.kind)
  if ('status' in end) span.setAttribute(STATUS_CODE, end.status)
  if (end.kind !== 'delivered') {
    span.setStatus({ code: SpanStatusCode.ERROR })
    span.setAttribute(ERROR_TYPE, 'status' in end ? String(end.status) : end.kind)
  }
  span.end()
}

/** Records a settle span (ack or nack of one attempt) in the message's trace; nothing when tracing is off. */
export function recordSettle(operation: 'ack' | 'nack', msg: MessageTrace, topicName: string, groupName: string, attempt: number): void {
  const tracer = activeTracer()
  if (!tracer) return
  tracer
    .startSpan(
      `${operation} ${topicName}`,
      {
        kind: SpanKind.CLIENT,
        attributes: {
          [SYSTEM]: 'hookq',
          [OPERATION_TYPE]: 'settle',
          [OPERATION_NAME]: operation,
          [DESTINATION]: topicName,
          [GROUP]: groupName,
          [ATTEMPT]: attempt,
        },
      },
      childOf(parentOf(msg)),
    )
    .end()
}

/** Records the dead-lettering of a message (to `deadLetterTopic`, or recorded as dead without one). */
export function recordDeadLetter(
  msg: MessageTrace,
  topicName: string,
  groupName: string,
  attempts: number,
  deadLetterTopic: string | null,
  error: string,
): void {
  const tracer = activeTracer()
  if (!tracer) return
  const span = tracer.startSpan(
    `dead_letter ${topicName}`,
    {
      kind: deadLetterTopic === null ? SpanKind.INTERNAL : SpanKind.PRODUCER,
      attributes: {
        [SYSTEM]: 'hookq',
        [OPERATION_TYPE]: 'send',
        [OPERATION_NAME]: 'dead_letter',
        [DESTINATION]: deadLetterTopic ?? topicName,
        [GROUP]: groupName,
        [ATTEMPT]: attempts,
      },
    },
    childOf(parentOf(msg)),
  )
  span.setStatus({ code: SpanStatusCode.ERROR, message: error.slice(0, 200) })
  span.end()
}

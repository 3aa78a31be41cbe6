/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/) for messages: what produce takes, what a
 * message keeps, what each push carries. Pure functions, no OpenTelemetry (tracing.ts records spans).
 *
 * A message keeps its creation context: the producer's `traceparent` (a message's own header, else
 * the produce call's) and `tracestate`, or, without a valid one, only a trace id of its own, made at
 * produce. Every attempt carries `00-<the message's trace id>-<a new span id>-<flags>`: the trace
 * runs from the producer through each attempt, and no attempt reuses the producer's span id.
 */
import { randomFillSync } from 'node:crypto'

/** The trace a message keeps (messages.trace_id, .traceparent, .tracestate). */
export interface MessageTrace {
  /** 32 lowercase hex digits, never all zero. */
  traceId: string
  /** The creation context, version 00 (null: hookq began the trace, no producer span to name). */
  traceparent: string | null
  tracestate: string | null
}

/** A produce call's own context (its HTTP headers), parsed once for all its messages. */
export interface CallTrace {
  traceparent: string
  tracestate: string | null
}

// version-traceid-parentid-flags; version 00 is exactly this, later versions may append "-...".
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-|$)/
const ZERO_TRACE_ID = '00000000000000000000000000000000'
const ZERO_SPAN_ID = '0000000000000000'

/**
 * A `traceparent` value normalised to version 00, or null when it is not valid: lowercase hex, ids
 * not all zero, version ff refused, version 00 exactly 55 characters. A later version is read as
 * the spec says (its first four fields, then the end or a dash) and keeps only the sampled flag.
 */
export function parseTraceparent(value: unknown): string | null {
  if (typeof value !== 'string' || value.length < 55) return null
  const m = TRACEPARENT.exec(value)
  if (!m) return null
  const [, version, traceId, spanId, flags] = m as unknown as [string, string, string, string, string]
  if (version === 'ff' || traceId === ZERO_TRACE_ID || spanId === ZERO_SPAN_ID) return null
  if (version === '00') return value.length === 55 ? value : null
  return `00-${traceId}-${spanId}-${(Number.parseInt(flags, 16) & 1) === 1 ? '01' : '00'}`
}

// list-member: key "=" value (W3C tracestate, level 1): simple or tenant@system keys, printable values.
const MEMBER =
  /^(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$/
/** Longest tracestate kept (the spec asks to propagate at least 512 characters). */
const MAX_TRACESTATE = 512

/**
 * A `tracestate` value (one header, or several joined by commas) normalised, or null when absent,
 * empty, or not valid (a bad member, more than 32, longer than 512 characters): dropped whole.
 */
export function parseTracestate(value: unknown): string | null {
  if (Array.isArray(value)) value = value.join(',')
  if (typeof value !== 'string' || value.length === 0 || value.length > MAX_TRACESTATE * 2) return null
  const members: string[] = []
  for (const raw of value.split(',')) {
    const member = raw.trim()
    if (member === '') continue
    if (!MEMBER.test(member) || members.length === 32) return null
    members.push(member)
  }
  const joined = members.join(',')
  return joined === '' || joined.length > MAX_TRACESTATE ? null : joined
}

/** The context of a produce call from its HTTP headers; null without a valid traceparent. */
export function callTrace(headers: { traceparent?: unknown; tracestate?: unknown }): CallTrace | null {
  if (headers.traceparent === undefined) return null
  const traceparent = parseTraceparent(headers.traceparent)
  return traceparent === null ? null : { traceparent, tracestate: parseTracestate(headers.tracestate) }
}

/**
 * The trace of one produced message: its own `traceparent` header (with its own `tracestate`) when
 * valid, else the call's, else a new trace id. `into` is filled in place (the produce path makes no
 * object per message for it).
 */
export function messageTrace(headers: Record<string, string> | undefined, call: CallTrace | null, into: MessageTrace): void {
  const own = headers?.traceparent === undefined ? null : parseTraceparent(headers.traceparent)
  if (own !== null) {
    into.traceId = own.slice(3, 35)
    into.traceparent = own
    into.tracestate = parseTracestate(headers!.tracestate)
  } else if (call !== null) {
    into.traceId = call.traceparent.slice(3, 35)
    into.traceparent = call.traceparent
    into.tracestate = call.tracestate
  } else {
    into.traceId = newTraceId()
    into.traceparent = null
    into.tracestate = null
  }
}

/** The trace in a message's stored headers (hookq_produce's rows): a quick look for the name before parsing. */
export function traceOfHeaderText(headers: string, into: MessageTrace): void {
  let parsed: Record<string, string> | undefined
  if (headers.includes('"traceparent"')) {
    try {
      parsed = JSON.parse(headers) as Record<string, string>
    } catch {
      parsed = undefined
    }
  }
  messageTrace(parsed, null, into)
}

/**
 * The `traceparent` of one push attempt: the message's trace id, `spanId` (the attempt's own), and
 * the producer's flags; a trace hookq began is marked sampled, so that a consumer's parent-based
 * sampler keeps every attempt of it in one trace rather than dropping them all.
 */
export function attemptTraceparent(msg: { traceId: string; traceparent: string | null }, spanId: string): string {
  return `00-${msg.traceId}-${spanId}-${msg.traceparent === null ? '01' : msg.traceparent.slice(53, 55)}`
}

// Random ids come from a pool filled 4 KiB at a time: one call to the CSPRNG per 256 span ids,
// instead of one per push (~1 µs each).
const pool = Buffer.allocUnsafe(4096)
let poolAt = pool.length

function randomHex(bytes: number, zero: string): string {
  for (;;) {
    if (poolAt + bytes > pool.length) {
      randomFillSync(pool)
      poolAt = 0
    }
    const hex = pool.toString('hex', poolAt, poolAt + bytes)
    poolAt += bytes
    if (hex !== zero) return hex
  }
}

/** A new random trace id (16 bytes, 32 hex digits, never all zero). */
export function newTraceId(): string {
  return randomHex(16, ZERO_TRACE_ID)
}

/** A new random span id (8 bytes, 16 hex digits, never all zero). */
export function newSpanId(): string {
  return randomHex(8, ZERO_SPAN_ID)
}

/**
 * What a push looks like on the wire: the body (the contract's envelope, or the bare value for
 * pushFormat "raw") and its headers, Standard Webhooks ones included. Values are spliced in as
 * their stored JSON text, never parsed and re-serialised.
 */
import type { DispatchMessage } from '../core/dispatch-message.ts'
import { signHeaders, signWebhook } from '../core/signature.ts'
import { attemptTraceparent, newSpanId } from '../core/trace-context.ts'

export interface PushTarget {
  groupName: string
  topicName: string
  topicId: number
  partition: number
  pushFormat: 'envelope' | 'raw'
  /** Secrets to sign with, current first (empty: unsigned); see signingSecrets. */
  consumerSecrets: readonly string[]
}

/** No secrets: the same empty list every time (signingSecrets' answer for most consumers). */
const UNSIGNED: readonly string[] = Object.freeze([])

/**
 * The secrets a push to this consumer is signed with at `nowMs`: the current one, then the one it
 * replaced while its rotation overlap lasts (previousSecretExpiresAt still ahead).
 */
export function signingSecrets(
  c: { secret: string | null; previousSecret: string | null; previousSecretExpiresAt: Date | null },
  nowMs: number,
): readonly string[] {
  if (!c.secret && !c.previousSecret) return UNSIGNED
  const secrets: string[] = []
  if (c.secret) secrets.push(c.secret)
  if (c.previousSecret && c.previousSecret !== c.secret && c.previousSecretExpiresAt && c.previousSecretExpiresAt.getTime() > nowMs) {
    secrets.push(c.previousSecret)
  }
  return secrets
}

/** JSON with every non-ASCII character escaped, so it is safe in an HTTP header. */
function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
}

/**
 * The stable message id for webhook-id: the same for every attempt of one message (consumers
 * deduplicate on it). Topic ids are never reused, so a recreated topic gets new ids.
 */
export function webhookId(topicId: number, partition: number, offset: number): string {
  return `msg_${topicId}_${partition}_${offset}`
}

/**
 * An ISO 8601 formatter for epoch ms that keeps the text of the last second it formatted:
 * Date#toISOString costs ~1 µs, and under load nearly every call falls in the same second as the
 * one before (ack deadlines now + ackTimeoutMs; the production times of a backlog read in order).
 * One formatter per kind of time, so deadlines and production times do not evict each other.
 */
export function isoFormatter(): (ms: number) => string {
  let second = NaN
  let prefix = ''
  return (ms) => {
    const s = Math.floor(ms / 1000)
    // Outside years 0000-9999 toISOString writes a signed six-digit year: not worth keeping.
    if (!(s >= 0 && s < 253_402_300_800)) return new Date(ms).toISOString()
    if (s !== second) {
      second = s
      prefix = new Date(s * 1000).toISOString().slice(0, 20) // 'YYYY-MM-DDTHH:MM:SS.'
    }
    const m = Math.floor(ms) - s * 1000
    return `${prefix}${m < 10 ? '00' : m < 100 ? '0' : ''}${m}Z`
  }
}

const deadlineIso = isoFormatter()
const producedIso = isoFormatter()

/** A push as it goes out: the body, and its header lines (`name: value\r\n` each; no Host or Content-Length). */
export interface BuiltPush {
  body: string
  headerLines: string
}

/**
 * Body and header lines of one push attempt. `traceparent`: the attempt's own (tracing.ts
 * startAttempt); without it, one with a new span id in the message's trace.
 */
export function buildPush(
  target: PushTarget,
  msg: DispatchMessage,
  deliveryId: string,
  attempt: number,
  ackDeadlineMs: number,
  nowMs: number,
  traceparent = attemptTraceparent(msg, newSpanId()),
): BuiltPush {
  if (target.pushFormat !== 'raw' && target.consumerSecrets.length === 0) {
    // The common push, an unsigned envelope: its lines written at once, with no headers object
    // to build and walk (every value is ours: a base64url id, numbers, a validated-name id, a
    // validated traceparent and tracestate).
    return {
      body: buildEnvelope(target, msg, deliveryId, attempt, ackDeadlineMs, traceparent),
      headerLines:
        `content-type: application/json\r\nuser-agent: hookq\r\nhookq-delivery-id: ${deliveryId}\r\nhookq-attempt: ${attempt}\r\n` +
        `webhook-id: ${webhookId(target.topicId, target.partition, msg.offset)}\r\nwebhook-timestamp: ${Math.floor(nowMs / 1000)}\r\n` +
        `traceparent: ${traceparent}\r\n${msg.tracestate === null ? '' : `tracestate: ${msg.tracestate}\r\n`}`,
    }
  }
  let body: string
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'user-agent': 'hookq',
    'hookq-delivery-id': deliveryId,
    'hookq-attempt': String(attempt),
    traceparent,
  }
  if (msg.tracestate !== null) headers.tracestate = msg.tracestate
  if (target.pushFormat === 'raw') {
    body = msg.value
    Object.assign(headers, {
      'hookq-topic': target.topicName,
      'hookq-group': target.groupName,
      'hookq-partition': String(target.partition),
      'hookq-offset': String(msg.offset),
      'hookq-ack-deadline': deadlineIso(ackDeadlineMs),
      'hookq-timestamp': producedIso(msg.producedAtMs),
    })
    if (msg.key !== null) headers['hookq-key'] = asciiJson(msg.key)
    if (msg.headers !== '{}') headers['hookq-headers'] = asciiJson(JSON.parse(msg.headers))
  } else {
    body = buildEnvelope(target, msg, deliveryId, attempt, ackDeadlineMs, traceparent)
  }
  return finish(target, body, headers, webhookId(target.topicId, target.partition, msg.offset), nowMs)
}

/**
 * The envelope of one push attempt: a single push's body, one member of a batch's `deliveries`,
 * and (to come) one message of a pull's answer. It carries the attempt's `traceparent` and the
 * producer's `tracestate` ("" when none), so that it can serve as an OpenTelemetry carrier as is.
 */
export function buildEnvelope(
  target: PushTarget,
  msg: DispatchMessage,
  deliveryId: string,
  attempt: number,
  ackDeadlineMs: number,
  traceparent = attemptTraceparent(msg, newSpanId()),
): string {
  // A template, not [...].join(''): the join costs ~1 µs, and flattening the template's string
  // when the request is written costs less than that.
  // Delivery ids are base64url and names match [A-Za-z0-9._-]: neither needs JSON escaping.
  return (
    `{"deliveryId":"${deliveryId}","topic":"${target.topicName}","group":"${target.groupName}","partition":${target.partition},` +
    `"offset":${msg.offset},"key":${msg.key === null ? 'null' : JSON.stringify(msg.key)},"value":${msg.value},"headers":${msg.headers},` +
    `"attempt":${attempt},"timestamp":"${producedIso(msg.producedAtMs)}","ackDeadline":"${deadlineIso(ackDeadlineMs)}",` +
    // tracestate may hold '"' and '\\' (W3C allows both in values): JSON-escaped.
    `"traceparent":"${traceparent}","tracestate":${msg.tracestate === null ? '""' : JSON.stringify(msg.tracestate)}}`
  )
}

/**
 * A batch push: `{"deliveries": [<envelope>, ...]}` with the Standard Webhooks headers computed
 * over it, `id` (webhook-id) naming the batch. hookq-batch-size says how many it carries. Each
 * envelope carries its own message's trace; the request's `traceparent` and `tracestate` headers
 * are its first message's attempt's (`first`), for a consumer whose HTTP instrumentation reads
 * only headers (a produce call's messages, often batched together, share that trace).
 */
export function buildBatchPush(
  target: PushTarget,
  envelopes: readonly string[],
  id: string,
  nowMs: number,
  first?: { traceparent: string; tracestate: string | null },
): BuiltPush {
  const body = `{"deliveries":[${envelopes.join(',')}]}`
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'user-agent': 'hookq',
    'hookq-batch-size': String(envelopes.length),
  }
  if (first) {
    headers.traceparent = first.traceparent
    if (first.tracestate !== null) headers.tracestate = first.tracestate
  }
  return finish(target, body, headers, id, nowMs)
}

/** Adds the Standard Webhooks headers (and hookq-signature) to a push, and writes its header lines. */
function finish(target: PushTarget, body: string, headers: Record<string, string>, id: string, nowMs: number): BuiltPush {
  const timestampS = Math.floor(nowMs / 1000)
  headers['webhook-id'] = id
  headers['webhook-timestamp'] = String(timestampS)
  if (target.consumerSecrets.length > 0) {
    headers['webhook-signature'] = signWebhook({ id, timestampS, body, secrets: target.consumerSecrets })
    // The hookq-* headers too: in raw format they are the message's coordinates.
    headers['hookq-signature'] = signHeaders({ id, timestampS, headers, secrets: target.consumerSecrets })
  }
  // Every value above is ours: numbers, ids, ISO times, validated names, ASCII-escaped JSON, base64.
  let headerLines = ''
  for (const name in headers) headerLines += `${name}: ${headers[name]!}\r\n`
  return { body, headerLines }
}

/**
 * One HTTP push to a consumer's webhook URL, and what came of it. No database, no retries, no
 * signing: the dispatcher builds the body and headers, calls `push`, and records the result.
 *
 *   delivered   a 2xx answer, headers and body, within the deadline
 *   rejected    any other status, 3xx included: redirects are never followed
 *   timeout     no complete answer (headers and body) within `timeoutMs`, queueing time included
 *   network     refused, reset, DNS failure, bad URL, ...: no HTTP answer at all
 *
 * undici's `headersTimeout`/`bodyTimeout` alone cannot give a deadline: both are idle timers (a
 * consumer sending one byte a second never trips `bodyTimeout`), neither counts connecting or
 * waiting for a pooled connection, and above 1 s undici runs them on a coarse ~500 ms tick. So an
 * AbortController on a native timer is the deadline, and the two undici timeouts are only backstops.
 */
import { Agent, request, type Dispatcher } from 'undici'

/** What the dispatcher asks for: a POST of `body` with `headers` to `url`. */
export interface PushRequest {
  url: string
  body: string | Buffer
  headers: Record<string, string>
  /** Deadline for the complete answer, headers and body, ms. */
  timeoutMs: number
  /** Bytes of the answer's body kept for the attempt log; the rest is discarded. Default 4 KiB. */
  maxResponseBytes?: number
}

/** The outcome of one push. `durationMs` runs from the call to the complete answer or the failure. */
export type PushResult =
  | { kind: 'delivered'; status: number; durationMs: number; body: string }
  | { kind: 'rejected'; status: number; durationMs: number; body: string; retryAfterMs?: number }
  | { kind: 'timeout'; durationMs: number }
  | { kind: 'network'; durationMs: number; error: string }

/** Default cap on the response body kept, bytes: enough for an error message, small in a log row. */
export const DEFAULT_MAX_RESPONSE_BYTES = 4096

/** Options of `createPushAgent`; the defaults suit a broker pushing to many consumers. */
export interface PushAgentOptions {
  /** Sockets per origin (default 32); more pushes to one consumer queue inside undici. */
  connections?: number
  /** Idle time before a pooled socket is closed, ms (default 4000: below Node's 5 s server default, so we close first). */
  keepAliveTimeoutMs?: number
  /** Cap on a server's `Keep-Alive: timeout=` hint, ms (default 60 000). */
  keepAliveMaxTimeoutMs?: number
  /** TCP (and TLS) connect timeout, ms (default 10 000); the push deadline still applies on top. */
  connectTimeoutMs?: number
}

/**
 * The undici dispatcher for pushes: pooled keep-alive sockets, a bounded number per origin, no
 * pipelining (a slow consumer must not hold up the pushes queued behind it on one socket).
 * It follows no redirects: in undici 7 only the redirect interceptor does, and none is composed
 * here. Response size is capped by `push` itself, not `maxResponseSize`, which would fail a 2xx
 * with an error and lose its status. Call `close()` (or `destroy()`) on shutdown.
 */
export function createPushAgent(opts: PushAgentOptions = {}): Agent {
  return new Agent({
    connections: opts.connections ?? 32,
    pipelining: 1,
    keepAliveTimeout: opts.keepAliveTimeoutMs ?? 4_000,
    keepAliveMaxTimeout: opts.keepAliveMaxTimeoutMs ?? 60_000,
    connect: { timeout: opts.connectTimeoutMs ?? 10_000 },
  })
}

/** Marks our own deadline, so an abort is told apart from every other error. */
const DEADLINE = new Error('push deadline passed')

/**
 * POSTs one push and classifies the answer. Never throws: every failure is a `PushResult`.
 * The response body is read up to `maxResponseBytes`; past that the stream is destroyed (closing the
 * socket if the body was still arriving) so an endless body costs neither memory nor time, and the
 * status still counts.
 * `nowMs` is a monotonic clock for `durationMs`.
 */
export async function push(dispatcher: Dispatcher, req: PushRequest, nowMs: () => number = () => performance.now()): Promise<PushResult> {
  const startMs = nowMs()
  const elapsedMs = () => Math.round(nowMs() - startMs)
  // 0 turns undici's timeouts off and setTimeout fires at once past 2^31-1 ms, so clamp a bad value.
  const timeoutMs = Math.min(Math.max(1, req.timeoutMs || 0), 2 ** 31 - 1)
  const controller = new AbortController()
  const timer = setTimeout(() => controller.abort(DEADLINE), timeoutMs)
  try {
    const res = await request(req.url, {
      dispatcher,
      method: 'POST',
      body: req.body,
      headers: req.headers,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
      signal: controller.signal,
    })
    const body = await readCapped(res.body, req.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES)
    const status = res.statusCode
    if (status >= 200 && status < 300) return { kind: 'delivered', status, durationMs: elapsedMs(), body }
    const result: PushResult = { kind: 'rejected', status, durationMs: elapsedMs(), body }
    if (status === 429 || status === 503) {
      const retryAfterMs = parseRetryAfterMs(res.headers['retry-after'])
      if (retryAfterMs !== undefined) result.retryAfterMs = retryAfterMs
    }
    return result
  } catch (err) {
    if (controller.signal.aborted || isUndiciTimeout(err)) return { kind: 'timeout', durationMs: elapsedMs() }
    return { kind: 'network', durationMs: elapsedMs(), error: describeError(err) }
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Reads at most `maxBytes` of `body` as text, destroying the stream at the first chunk past the cap.
 * A body undici had already received whole (a small one, in one read) leaves its socket reusable
 * anyway; one still arriving costs its socket, which beats reading on for a keep-alive.
 * A multi-byte character cut at the cap becomes U+FFFD.
 */
async function readCapped(body: Dispatcher.ResponseData['body'], maxBytes: number): Promise<string> {
  const kept: Buffer[] = []
  let keptBytes = 0
  // Bounded: each turn consumes a chunk of a stream that ends, errors at the deadline, or is cut here.
  for await (const chunk of body as AsyncIterable<Buffer>) {
    const room = maxBytes - keptBytes
    if (room > 0) {
      kept.push(chunk.length > room ? chunk.subarray(0, room) : chunk)
      keptBytes += Math.min(chunk.length, room)
    }
    if (chunk.length > room) break // leaving the loop destroys the stream and aborts the request
  }
  return Buffer.concat(kept).toString('utf8')
}

/**
 * `Retry-After` as a delay in ms: delta-seconds (`"120"`) or an HTTP-date, counted from
 * `wallNowMs` (HTTP-dates are whole seconds, so expect up to 1 s less than the sender meant).
 * A date in the past gives 0; anything unparsable gives undefined.
 */
export function parseRetryAfterMs(value: string | string[] | undefined, wallNowMs: number = Date.now()): number | undefined {
  const text = (Array.isArray(value) ? value[0] : value)?.trim()
  if (!text) return undefined
  if (/^\d+$/.test(text)) return Number(text) * 1000
  // Every HTTP-date form names its weekday and month; V8's lenient Date.parse would read '-5' or '1.5' as years.
  if (!/[A-Za-z]{3}/.test(text)) return undefined
  const dateMs = Date.parse(text)
  return Number.isNaN(dateMs) ? undefined : Math.max(0, dateMs - wallNowMs)
}

/** undici's own header and body timeouts are backstops of the same deadline, not network failures. */
function isUndiciTimeout(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT'
}

/** A short, log-friendly description: code and message, with the cause's code (e.g. ECONNRESET). */
function describeError(err: unknown): string {
  // Node reports a failed connect to a host with several addresses as an AggregateError of each try.
  const first = err instanceof AggregateError && err.errors.length > 0 ? err.errors[0] : err
  if (!(first instanceof Error)) return String(first).slice(0, 300)
  const code = (first as { code?: unknown }).code
  const causeCode = (first.cause as { code?: unknown } | undefined)?.code
  const parts = [code, first.message, causeCode && causeCode !== code ? `(${String(causeCode)})` : undefined]
  return parts.filter(Boolean).join(' ').slice(0, 300)
}

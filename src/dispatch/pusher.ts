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
 * waiting for a pooled connection, and above 1 s undici runs them on a coarse ~500 ms tick. So a
 * native timer that aborts the request is the deadline, and the two undici timeouts are backstops.
 */
import dns from 'node:dns'
import type { LookupFunction } from 'node:net'
import { Agent, type Dispatcher } from 'undici'
import { checkAddress, checkUrl, type UrlPolicy } from '../security/url-policy.ts'

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
  /**
   * The push URL policy, enforced at connect time on every address DNS answers (no DNS-rebinding
   * bypass) and by `push` on the URL itself (IP literals never reach `lookup`). None: no checks.
   */
  policy?: UrlPolicy
  /** The resolver the policy wraps (default `dns.lookup`); tests inject a fake one. */
  lookup?: LookupFunction
}

/** The policy of each agent `createPushAgent` built with one, for `push` to check URLs against. */
const agentPolicies = new WeakMap<Dispatcher, UrlPolicy>()

/** A push refused by the URL policy, before or while connecting. */
export class PushPolicyError extends Error {
  override name = 'PushPolicyError'
  readonly code = 'ERR_PUSH_URL_POLICY'
}

/**
 * `lookup` (default `dns.lookup`) with every address it answers checked against the policy: one
 * denied address fails the connect with a PushPolicyError naming it. Handles both the single
 * answer and the `all: true` form Node's connect uses with autoSelectFamily.
 */
export function policyLookup(policy: UrlPolicy, lookup: LookupFunction = dns.lookup as LookupFunction): LookupFunction {
  return (hostname, options, callback) => {
    lookup(hostname, options, ((err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => {
      if (err) return callback(err, address as string, family)
      const answers = Array.isArray(address) ? address : [{ address, family: family ?? 0 }]
      for (const a of answers) {
        const verdict = checkAddress(a.address, a.family, policy)
        if (!verdict.allowed) return callback(new PushPolicyError(`${verdict.reason} (host ${hostname})`), '', 0)
      }
      ;(callback as (...args: unknown[]) => void)(null, address, family)
    }) as Parameters<LookupFunction>[2])
  }
}

/**
 * The undici dispatcher for pushes: pooled keep-alive sockets, a bounded number per origin, no
 * pipelining (a slow consumer must not hold up the pushes queued behind it on one socket).
 * It follows no redirects: in undici 7 only the redirect interceptor does, and none is composed
 * here. Response size is capped by `push` itself, not `maxResponseSize`, which would fail a 2xx
 * with an error and lose its status. Call `close()` (or `destroy()`) on shutdown.
 */
export function createPushAgent(opts: PushAgentOptions = {}): Agent {
  const lookup = opts.policy ? policyLookup(opts.policy, opts.lookup) : opts.lookup
  const agent = new Agent({
    connections: opts.connections ?? 32,
    pipelining: 1,
    keepAliveTimeout: opts.keepAliveTimeoutMs ?? 4_000,
    keepAliveMaxTimeout: opts.keepAliveMaxTimeoutMs ?? 60_000,
    connect: { timeout: opts.connectTimeoutMs ?? 10_000, ...(lookup ? { lookup } : {}) },
  })
  if (opts.policy) agentPolicies.set(agent, opts.policy)
  return agent
}

/** A consumer URL as `push` uses it: where to send, or why it may not. */
type Target = { origin: string; path: string } | { error: string }

/**
 * Each agent's URLs, parsed and checked against its policy once: both are pure functions of the
 * URL (the policy is fixed per agent), and per push they cost ~8% of the broker's CPU (BlockList
 * checks allocate). Bounded: cleared past TARGETS_MAX distinct URLs.
 */
const targets = new WeakMap<Dispatcher, Map<string, Target>>()
const TARGETS_MAX = 10_000

function targetOf(dispatcher: Dispatcher, raw: string): Target {
  let cache = targets.get(dispatcher)
  if (!cache) targets.set(dispatcher, (cache = new Map()))
  let target = cache.get(raw)
  if (target) return target
  try {
    const url = new URL(raw)
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`unsupported protocol ${url.protocol}`)
    // The agent's lookup checks resolved names; an IP literal (or a URL registered before the
    // policy changed) is checked here.
    const policy = agentPolicies.get(dispatcher)
    const verdict = policy ? checkUrl(url, policy) : { allowed: true as const }
    if (!verdict.allowed) throw new PushPolicyError(verdict.reason.includes('push URL policy') ? verdict.reason : `${verdict.reason}: denied by the push URL policy`)
    target = { origin: url.origin, path: url.pathname + url.search }
  } catch (err) {
    target = { error: describeError(err) }
  }
  if (cache.size >= TARGETS_MAX) cache.clear()
  cache.set(raw, target)
  return target
}

/** Response bytes read (and dropped past the cap) before a push gives up on its socket. */
const DISCARD_BYTES = 64 * 1024

/** Our own reasons to abort a request, told apart from every other error. */
const DEADLINE = new Error('push deadline passed')
const CUT = new Error('response body cut at the cap')

/**
 * POSTs one push and classifies the answer. Never throws: every failure is a `PushResult`.
 * It drives undici's `dispatch()` with a handler rather than `request()`: no response stream, no
 * AbortController, half the client CPU per push (bench:e2e measures both). The response body is
 * kept up to `maxResponseBytes`; the rest is dropped, and past 64 KiB the request is aborted
 * (closing its socket), so an endless body costs neither memory nor time, and the status still counts.
 * `nowMs` is a monotonic clock for `durationMs`.
 */
export function push(dispatcher: Dispatcher, req: PushRequest, nowMs: () => number = () => performance.now()): Promise<PushResult> {
  const startMs = nowMs()
  const elapsedMs = () => Math.round(nowMs() - startMs)
  // 0 turns undici's timeouts off and setTimeout fires at once past 2^31-1 ms, so clamp a bad value.
  const timeoutMs = Math.min(Math.max(1, req.timeoutMs || 0), 2 ** 31 - 1)
  const maxBytes = req.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES
  const target = targetOf(dispatcher, req.url)
  if ('error' in target) return Promise.resolve({ kind: 'network', durationMs: elapsedMs(), error: target.error })
  return new Promise<PushResult>((resolve) => {
    let settled = false
    let status = 0
    let retryAfter: string | undefined
    const kept: Buffer[] = []
    let keptBytes = 0
    let seenBytes = 0
    let abort: ((reason?: Error) => void) | undefined
    const settle = (result: PushResult) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      resolve(result)
    }
    const answered = (): PushResult => {
      const body = Buffer.concat(kept).toString('utf8')
      if (status >= 200 && status < 300) return { kind: 'delivered', status, durationMs: elapsedMs(), body }
      const result: PushResult = { kind: 'rejected', status, durationMs: elapsedMs(), body }
      if (status === 429 || status === 503) {
        const retryAfterMs = parseRetryAfterMs(retryAfter)
        if (retryAfterMs !== undefined) result.retryAfterMs = retryAfterMs
      }
      return result
    }
    const timer = setTimeout(() => {
      settle({ kind: 'timeout', durationMs: elapsedMs() })
      abort?.(DEADLINE)
    }, timeoutMs)
    const handler = {
      onConnect(abortRequest: (reason?: Error) => void) {
        abort = abortRequest
        if (settled) abortRequest(DEADLINE) // the deadline passed while waiting for a connection
      },
      onHeaders(statusCode: number, rawHeaders: Buffer[]) {
        status = statusCode
        for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
          if (rawHeaders[i]!.length === 11 && rawHeaders[i]!.toString('latin1').toLowerCase() === 'retry-after') {
            retryAfter = rawHeaders[i + 1]!.toString('latin1')
          }
        }
        return true
      },
      onData(chunk: Buffer) {
        const room = maxBytes - keptBytes
        if (room > 0) {
          kept.push(chunk.length > room ? chunk.subarray(0, room) : chunk)
          keptBytes += Math.min(chunk.length, room)
        }
        // Past the cap the rest is read and dropped, so a modest body still leaves its keep-alive
        // socket reusable; past DISCARD_BYTES (an endless body) the request is aborted instead.
        seenBytes += chunk.length
        if (seenBytes > Math.max(DISCARD_BYTES, maxBytes)) {
          settle(answered())
          abort?.(CUT)
          return false
        }
        return true
      },
      onComplete() {
        settle(answered())
      },
      onError(err: Error) {
        if (settled) return // our own abort (deadline or cap) after the result was settled
        if (isUndiciTimeout(err)) settle({ kind: 'timeout', durationMs: elapsedMs() })
        else settle({ kind: 'network', durationMs: elapsedMs(), error: describeError(err) })
      },
    }
    try {
      dispatcher.dispatch({
        origin: target.origin, path: target.path, method: 'POST',
        headers: req.headers, body: req.body, headersTimeout: timeoutMs, bodyTimeout: timeoutMs,
      }, handler as unknown as Dispatcher.DispatchHandler)
    } catch (err) {
      settle({ kind: 'network', durationMs: elapsedMs(), error: describeError(err) })
    }
  })
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

/**
 * One HTTP push to a consumer's webhook URL, and what came of it. No database, no retries, no
 * signing: the dispatcher builds the body and headers, calls `push`, and records the result.
 *
 *   delivered   a 2xx answer, headers and body, within the deadline
 *   rejected    any other status, 3xx included: redirects are never followed
 *   timeout     no complete answer (headers and body) within `timeoutMs`, queueing time included
 *   network     refused, reset, DNS failure, bad URL, ...: no HTTP answer at all
 *
 * The requests go out on the broker's own HTTP/1.1 client (http-client.ts; why not undici is said
 * there), one native timer per push being the deadline.
 */
import dns from 'node:dns'
import type { LookupFunction } from 'node:net'
import { checkAddress, checkUrl, type UrlPolicy } from '../security/url-policy.ts'
import { HttpClient, type HttpOutcome, type Origin } from './http-client.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

/** What the dispatcher asks for: a POST of `body` with `headers` to `url`. */
export interface PushRequest {
  url: string
  body: string | Buffer
  /** Headers to send, each checked for line breaks (and Latin-1) before it is written. */
  headers?: Record<string, string>
  /**
   * Header lines, `name: value\r\n` each, when the caller built them from values it made itself
   * (the envelope's): used as they are, unchecked, in place of `headers`.
   */
  headerLines?: string
  /** Deadline for the complete answer, headers and body, ms. */
  timeoutMs: number
  /** Bytes of the answer's body kept for the attempt log; the rest is discarded. Default 4 KiB. */
  maxResponseBytes?: number
  /** The consumer's push authentication (push-auth.ts), if it has one. */
  auth?: PushRequestAuth
  /**
   * Asked each time the push is given a connection (HttpRequest.mayStart), at once or after it
   * queued behind the origin's others: `mayStart` false ends it with `unsent` called instead of a
   * result (nothing reached the consumer); true, and it is written.
   */
  gate?: { mayStart(): boolean; unsent(): void }
}

/** Push authentication a request carries: its header lines, now or once a token is ready. */
export interface PushRequestAuth {
  /**
   * Header lines (`name: value\r\n` each) to add. A throw or a rejection fails the push unsent, as
   * a `network` result with the error's message (storable text, never a secret value).
   */
  lines(): string | Promise<string>
  /** The consumer answered 401 to a push that carried `lines`: a cached token is dropped. */
  unauthorized(lines: string): void
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
  /** Sockets per origin (default 32); more pushes to one consumer queue in the client. */
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

/** What push authentication reads of a consumer row (push-auth.ts). */
export interface AuthedConsumer {
  id: string
  url: string
  /** Its push authentication with its secret values, opened (null or absent: none). */
  pushAuth?: { type: string } | null
  /** Why its secret values could not be opened (a secrets key missing): its pushes fail with it, unsent. */
  secretsError?: string
}

/** Makes the authentication of pushes to a consumer (push-auth.ts's PushAuth). */
export interface PushAuthorizer {
  request(consumer: AuthedConsumer, group: string): PushRequestAuth
}

/** The pooled connections pushes go out on, with the URL policy they were built with. */
export class PushAgent extends HttpClient {
  /** Each consumer URL, parsed and checked against the policy once (see targetOf). */
  readonly targets = new Map<string, Target>()
  /** The push authentication of this process (set by the broker); none: consumers with auth are not pushed to. */
  authorizer: PushAuthorizer | undefined
  constructor(
    readonly policy: UrlPolicy | undefined,
    opts: ConstructorParameters<typeof HttpClient>[0],
  ) {
    super(opts)
  }
}

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
 * The client for pushes: pooled keep-alive sockets, a bounded number per origin, no pipelining (a
 * slow consumer must not hold up the pushes queued behind it on one socket), no redirects
 * followed. Call `close()` (or `destroy()`) on shutdown.
 */
export function createPushAgent(opts: PushAgentOptions = {}): PushAgent {
  const lookup = opts.policy ? policyLookup(opts.policy, opts.lookup) : opts.lookup
  return new PushAgent(opts.policy, {
    connections: opts.connections ?? 32,
    keepAliveTimeoutMs: opts.keepAliveTimeoutMs ?? 4_000,
    keepAliveMaxTimeoutMs: opts.keepAliveMaxTimeoutMs ?? 60_000,
    connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
    ...(lookup ? { lookup } : {}),
  })
}

/** A consumer URL as `push` uses it: where to send, or why it may not. */
type Target = { origin: Origin; path: string } | { error: string }

/**
 * Each URL, parsed and checked against the agent's policy once: both are pure functions of the URL
 * (the policy is fixed per agent), and per push they cost ~8% of the broker's CPU (BlockList
 * checks allocate). Bounded: cleared past TARGETS_MAX distinct URLs.
 */
const TARGETS_MAX = 10_000

function targetOf(agent: PushAgent, raw: string): Target {
  const cache = agent.targets
  let target = cache.get(raw)
  if (target) return target
  try {
    const url = new URL(raw)
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`unsupported protocol ${url.protocol}`)
    // The agent's lookup checks resolved names; an IP literal (or a URL registered before the
    // policy changed) is checked here.
    const verdict = agent.policy ? checkUrl(url, agent.policy) : { allowed: true as const }
    if (!verdict.allowed)
      throw new PushPolicyError(
        verdict.reason.includes('push URL policy') ? verdict.reason : `${verdict.reason}: denied by the push URL policy`,
      )
    const tls = url.protocol === 'https:'
    const port = url.port ? Number(url.port) : tls ? 443 : 80
    // URL keeps IPv6 literals in brackets; a socket wants them bare.
    const hostname = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
    target = { origin: { key: `${url.protocol}//${url.host}`, tls, hostname, port, host: url.host }, path: url.pathname + url.search }
  } catch (err) {
    target = { error: describeError(err) }
  }
  if (cache.size >= TARGETS_MAX) cache.clear()
  cache.set(raw, target)
  return target
}

/**
 * Header lines as the client writes them (one byte a character): a value with a line break would
 * split the request, and one beyond Latin-1 cannot be written as it is, so either throws.
 */
function headerLines(headers: Record<string, string>): string {
  let lines = ''
  for (const name in headers) {
    const value = headers[name]!
    // biome-ignore lint/suspicious/noControlCharactersInRegex: \x00-\xff is the Latin-1 range a header may hold
    if (/[\r\n]|[^\x00-\xff]/.test(value) || /[\r\n:]|[^\x00-\xff]/.test(name))
      throw new Error(`header ${JSON.stringify(name)} holds a line break or a character beyond Latin-1`)
    lines += `${name}: ${value}\r\n`
  }
  return lines
}

/**
 * POSTs one push and classifies the answer: `onResult` is called exactly once, never synchronously,
 * never with an exception. The response body is kept up to `maxResponseBytes`; the rest is
 * dropped, and past 64 KiB the connection is closed, so an endless body costs neither memory nor
 * time, and the status still counts. `nowMs` is a monotonic clock for `durationMs`.
 */
export function send(
  agent: PushAgent,
  req: PushRequest,
  onResult: (r: PushResult) => void,
  nowMs: () => number = () => performance.now(),
): void {
  const auth = req.auth
  if (auth === undefined) return sendWith(agent, req, undefined, '', onResult, nowMs)
  // With push authentication: its header lines added once they are ready (a token being fetched
  // or signed; a cached one is ready now). A throw or a rejection fails the push unsent.
  const startMs = nowMs()
  let lines: string | Promise<string>
  try {
    lines = auth.lines()
  } catch (err) {
    queueMicrotask(() => onResult(unsent(err, nowMs() - startMs)))
    return
  }
  if (typeof lines === 'string') sendWith(agent, req, auth, lines, onResult, nowMs)
  else
    lines.then(
      (ready) => sendWith(agent, req, auth, ready, onResult, nowMs),
      (err: unknown) => onResult(unsent(err, nowMs() - startMs)),
    )
}

/** A push its authentication failed (a token that could not be had): not sent, with the reason. */
function unsent(err: unknown, elapsedMs: number): PushResult {
  return { kind: 'network', durationMs: Math.round(elapsedMs), error: (err instanceof Error ? err.message : String(err)).slice(0, 300) }
}

/**
 * `send` once the authentication's lines (`authLines`, '' for none) are known: they follow the
 * request's own header lines, and a 401 answer tells the authentication which lines it refused.
 * The request object is read, never copied (a push with auth makes no object more than one without).
 */
function sendWith(
  agent: PushAgent,
  req: PushRequest,
  auth: PushRequestAuth | undefined,
  authLines: string,
  onResult: (r: PushResult) => void,
  nowMs: () => number,
): void {
  const startMs = nowMs()
  const elapsedMs = () => Math.round(nowMs() - startMs)
  // At least 1 ms: a timeout of 0 would fail every push at once.
  const timeoutMs = Math.max(1, timerDelayMs(req.timeoutMs))
  const target = targetOf(agent, req.url)
  let lines: string
  try {
    if ('error' in target) throw new Error(target.error)
    lines = req.headerLines ?? headerLines(req.headers ?? {})
  } catch (err) {
    const error = 'error' in target ? target.error : describeError(err)
    queueMicrotask(() => onResult({ kind: 'network', durationMs: elapsedMs(), error }))
    return
  }
  agent.request(target.origin, {
    path: target.path,
    headerLines: authLines === '' ? lines : lines + authLines,
    body: req.body,
    timeoutMs,
    maxBodyBytes: req.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES,
    ...(req.gate ? { mayStart: req.gate.mayStart } : {}),
    done: (o) => {
      // Refused by its gate when a connection was given (or the client destroyed meanwhile): never sent.
      if (o.kind === 'unsent') return req.gate?.unsent()
      const r = classify(o, elapsedMs())
      if (auth !== undefined && r.kind === 'rejected' && r.status === 401) auth.unauthorized(authLines)
      onResult(r)
    },
  })
}

/** `send` as a promise (for callers that await one push). */
export function push(agent: PushAgent, req: PushRequest, nowMs?: () => number): Promise<PushResult> {
  return new Promise((resolve) => send(agent, req, resolve, nowMs))
}

function classify(o: Exclude<HttpOutcome, { kind: 'unsent' }>, durationMs: number): PushResult {
  if (o.kind === 'timeout') return { kind: 'timeout', durationMs }
  if (o.kind === 'network') return { kind: 'network', durationMs, error: describeError(o.error) }
  if (o.status >= 200 && o.status < 300) return { kind: 'delivered', status: o.status, durationMs, body: o.body }
  const result: PushResult = { kind: 'rejected', status: o.status, durationMs, body: o.body }
  if (o.status === 429 || o.status === 503) {
    const retryAfterMs = parseRetryAfterMs(o.retryAfter)
    if (retryAfterMs !== undefined) result.retryAfterMs = retryAfterMs
  }
  return result
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

/**
 * The global options every command shares (--url, --api-key, --json, --timeout, --no-progress)
 * and the SDK client they make. Every call to the broker goes through `@hookq/client`; its fetch
 * is wrapped so that a refused connection or a timeout becomes an UnreachableError (exit 3)
 * naming the URL tried.
 */
import type { Command } from 'commander'
import { createClient, DEFAULT_URL, unwrap, type HookqClient } from '@hookq/client'
import { UnreachableError, UsageError } from './output.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

/** The global options as commander parses them. */
export interface GlobalOptions {
  url?: string
  apiKey?: string
  json?: boolean
  progress?: boolean
  timeout?: number
}

/** What a command needs: the client, where it points, and how to print. */
export interface CliContext {
  client: HookqClient
  url: string
  json: boolean
  /** Progress bars allowed (they still appear only on a terminal's stderr). */
  progress: boolean
  /** Aborted on Ctrl-C / SIGTERM by commands that listen for it. */
  signal: AbortSignal | undefined
}

/** The default time one call may take before the broker counts as unreachable. */
export const DEFAULT_TIMEOUT_MS = 30_000

/** Builds the context of a command from its options and the program's global ones. */
export function contextOf(cmd: Command, signal?: AbortSignal): CliContext {
  const o = cmd.optsWithGlobals<GlobalOptions>()
  const url = baseUrlOf(o.url || process.env.HOOKQ_URL || DEFAULT_URL)
  const apiKey = o.apiKey || process.env.HOOKQ_API_KEY || undefined
  const timeoutMs = o.timeout ?? DEFAULT_TIMEOUT_MS
  const client = createClient({ baseUrl: url, apiKey: apiKey ?? '', fetch: reachingFetch(url, timeoutMs) })
  return { client, url, json: o.json === true, progress: o.progress !== false, signal }
}

function baseUrlOf(text: string): string {
  let url: URL
  try {
    url = new URL(text)
  } catch {
    throw new UsageError(`--url / HOOKQ_URL must be an http:// or https:// URL, got ${JSON.stringify(text)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new UsageError(`--url / HOOKQ_URL must be an http:// or https:// URL, got ${JSON.stringify(text)}`)
  }
  return text.replace(/\/+$/, '')
}

// Failures that happen before a byte of the request leaves: the broker cannot have seen the call.
// Anything else (a reset, a closed socket, a timeout) may come after the broker read and acted on it.
const NOT_SENT_CODES = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EAI_FAIL',
  'EAI_NONAME',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EHOSTDOWN',
  'ENETDOWN',
  'EADDRNOTAVAIL',
  'UND_ERR_CONNECT_TIMEOUT',
])

// Statuses whose Response must have a null body (the fetch standard's "null body status").
const NULL_BODY_STATUSES = new Set([101, 103, 204, 205, 304])

/**
 * fetch with a per-call timeout that covers the whole call (connect, request, answer headers and
 * body), turning transport failures into UnreachableError. An abort the caller asked for (Ctrl-C)
 * is passed through as it is.
 *
 * The timeout is an AbortController and a timer, not `AbortSignal.any([signal, AbortSignal.timeout()])`:
 * nothing holds the signal AbortSignal.any returns, so a garbage collection during the wait
 * collected it and the timeout never fired (a broker that accepted a call and never answered hung
 * the CLI). The pending timer holds its controller. The body is read here, under the same timer,
 * because the SDK reads it after this function returns, where no timeout would cover it.
 */
function reachingFetch(url: string, timeoutMs: number): (request: Request) => Promise<Response> {
  return async (request) => {
    const abort = new AbortController()
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      abort.abort(new Error(`no answer within ${timeoutMs} ms`))
    }, timerDelayMs(timeoutMs))
    const forwardAbort = () => abort.abort(request.signal.reason)
    if (request.signal.aborted) forwardAbort()
    else request.signal.addEventListener('abort', forwardAbort, { once: true })
    try {
      // The SDK's bodies are JSON text: buffered, they keep their Content-Length (no chunked upload).
      const body = request.body === null ? undefined : await request.arrayBuffer()
      const response = await fetch(request.url, {
        method: request.method,
        headers: request.headers,
        body,
        redirect: request.redirect,
        signal: abort.signal,
      })
      const content = await response.arrayBuffer()
      return new Response(NULL_BODY_STATUSES.has(response.status) ? null : content, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      })
    } catch (err) {
      if (request.signal.aborted) throw err
      if (timedOut) throw new UnreachableError(url, `no answer within ${timeoutMs} ms`, true)
      throw new UnreachableError(url, reasonOf(err), !NOT_SENT_CODES.has(codeOf(err) ?? ''))
    } finally {
      clearTimeout(timer)
      request.signal.removeEventListener('abort', forwardAbort)
    }
  }
}

/** The system error code of a fetch failure (undici puts it in `cause`; a happy-eyeballs failure in its first error). */
function codeOf(err: unknown): string | undefined {
  const cause = (err as { cause?: { code?: unknown; errors?: Array<{ code?: unknown }> } }).cause
  const code = cause?.code ?? cause?.errors?.[0]?.code
  return typeof code === 'string' ? code : undefined
}

/** The useful part of a fetch failure: undici puts the system error (ECONNREFUSED ...) in `cause`. */
function reasonOf(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause
  if (cause?.code !== undefined) return cause.message ? cause.message : cause.code
  if (cause?.message) return cause.message
  return err instanceof Error ? err.message : String(err)
}

/** Like `unwrap`, keeping the HTTP status (201 created against 200 updated). */
export async function unwrapWithStatus<T>(
  call: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<{ data: T; status: number }> {
  const answer = await call
  const data = await unwrap(Promise.resolve(answer))
  return { data, status: answer.response.status }
}

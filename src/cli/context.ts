/**
 * The global options every command shares (--url, --api-key, --json, --timeout, --no-progress)
 * and the SDK client they make. Every call to the broker goes through `@hookq/client`; its fetch
 * is wrapped so that a refused connection or a timeout becomes an UnreachableError (exit 3)
 * naming the URL tried.
 */
import type { Command } from 'commander'
import { createClient, DEFAULT_URL, unwrap, type HookqClient } from '@hookq/client'
import { UnreachableError, UsageError } from './output.ts'

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
export function contextOf (cmd: Command, signal?: AbortSignal): CliContext {
  const o = cmd.optsWithGlobals<GlobalOptions>()
  const url = baseUrlOf(o.url || process.env.HOOKQ_URL || DEFAULT_URL)
  const apiKey = o.apiKey || process.env.HOOKQ_API_KEY || undefined
  const timeoutMs = o.timeout ?? DEFAULT_TIMEOUT_MS
  const client = createClient({ baseUrl: url, apiKey: apiKey ?? '', fetch: reachingFetch(url, timeoutMs) })
  return { client, url, json: o.json === true, progress: o.progress !== false, signal }
}

function baseUrlOf (text: string): string {
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

/**
 * fetch with a per-call timeout, turning transport failures into UnreachableError. An abort the
 * caller asked for (Ctrl-C) is passed through as it is.
 */
function reachingFetch (url: string, timeoutMs: number): (request: Request) => Promise<Response> {
  return async (request) => {
    const timeout = AbortSignal.timeout(timeoutMs)
    try {
      return await fetch(new Request(request, { signal: AbortSignal.any([request.signal, timeout]) }))
    } catch (err) {
      if (request.signal.aborted) throw err
      if (timeout.aborted) throw new UnreachableError(url, `no answer within ${timeoutMs} ms`)
      throw new UnreachableError(url, reasonOf(err))
    }
  }
}

/** The useful part of a fetch failure: undici puts the system error (ECONNREFUSED ...) in `cause`. */
function reasonOf (err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause
  if (cause?.code !== undefined) return cause.message ? cause.message : cause.code
  if (cause?.message) return cause.message
  return err instanceof Error ? err.message : String(err)
}

/** Like `unwrap`, keeping the HTTP status (201 created against 200 updated). */
export async function unwrapWithStatus<T> (call: Promise<{ data?: T, error?: unknown, response: Response }>): Promise<{ data: T, status: number }> {
  const answer = await call
  const data = await unwrap(Promise.resolve(answer))
  return { data, status: answer.response.status }
}

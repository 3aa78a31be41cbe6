/**
 * The push of the peer workers in bench/peers.ts (graphile-worker, pg-boss, RabbitMQ): one POST of
 * a message's JSON to the webhook sink through a keep-alive undici Agent, as hookq's pusher does
 * (one socket per concurrent push, no pipelining). The caller completes its job or acks only when
 * this answers true (a 2xx), so delivery is at least once, like hookq's ackMode auto.
 */
import { Agent } from 'undici'

export interface Pusher {
  /** POSTs `body` (JSON) to the sink; true on a 2xx, false on another status or a network error. */
  post(body: string | Uint8Array): Promise<boolean>
  /** Pushes answered 2xx, and the others (non-2xx or errors). */
  readonly counts: { ok: number; failed: number }
  close(): Promise<void>
}

/** `concurrency`: the most pushes the worker has in flight at once (its sockets to the sink). */
export function makePusher(sinkUrl: string, concurrency: number): Pusher {
  const url = new URL(sinkUrl)
  const agent = new Agent({ connections: concurrency, pipelining: 1, keepAliveTimeout: 4_000 })
  const counts = { ok: 0, failed: 0 }
  const headers = { 'content-type': 'application/json' }
  return {
    counts,
    async post(body) {
      try {
        const res = await agent.request({
          origin: url.origin,
          path: url.pathname,
          method: 'POST',
          headers,
          body,
          headersTimeout: 10_000,
          bodyTimeout: 10_000,
        })
        await res.body.dump()
        const ok = res.statusCode >= 200 && res.statusCode < 300
        if (ok) counts.ok++
        else counts.failed++
        return ok
      } catch (err) {
        counts.failed++
        if (counts.failed <= 3) console.error('push failed:', err instanceof Error ? err.message : err)
        return false
      }
    },
    close: () => agent.close(),
  }
}

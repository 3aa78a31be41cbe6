/**
 * A pull consumer: a loop that leases a pull group's messages (POST /v1/groups/{group}/pull with a
 * long poll), runs the handler on each, and settles it: an ack when the handler returns, a nack
 * (with `nackDelayMs`) when it throws. While a handler runs, its lease is extended every
 * leaseMs / 2, so a slow handler keeps its message. Stopped by stop() (or its AbortSignal): no new
 * pull is made, the handlers running are waited for. A pull under way is cut only while the broker
 * has not begun to answer it (then it has leased nothing to this caller); once its answer has
 * begun, the messages in it are leased to this caller, so they are handled and settled like the
 * others rather than dropped to wait out their leases (an attempt each).
 *
 * A small loop class with explicit states (running → stopping → stopped), a try/catch per pass so
 * the loop never dies, and an abortable backoff after an error (pg-boss's worker is the model).
 */
import { createClient, unwrap, type HookqClient, type HookqClientOptions } from './client.ts'
import type { components } from './schema.ts'

/** A pulled message: the push envelope (contract "Pull delivery"). */
export type PulledMessage = components['schemas']['PulledMessage']

export interface PullConsumerOptions<T = unknown> {
  /** The pull group (its `delivery` is "pull"). */
  group: string
  /** Runs once per message; returning acks it, throwing nacks it. */
  handler(message: PulledMessage & { value: T }): Promise<void> | void
  /** Messages leased per pull (1..1000, default 10); also how many handlers run at once at most. */
  maxMessages?: number
  /** Each pull waits up to this long for a message (default 20000, the most). */
  waitMs?: number
  /** Each lease's length (default the group's ackTimeoutMs); extended while its handler runs. */
  leaseMs?: number
  /** The delay of a nack when the handler throws (default: the group's backoff). */
  nackDelayMs?: number
  /** A client of your own; otherwise one from baseUrl/apiKey (default HOOKQ_URL and HOOKQ_API_KEY). */
  client?: HookqClient
  clientOptions?: HookqClientOptions
  /** Errors of the loop (a failed pull, ack or nack) and of handlers; default: console.error. */
  onError?(err: unknown, stage: 'pull' | 'handler' | 'ack' | 'nack' | 'extend'): void
  signal?: AbortSignal
}

export interface PullConsumer {
  /** Resolves when the loop has stopped (after stop(), or its signal). */
  readonly done: Promise<void>
  /** Stops pulling; resolves once the handlers running have settled their messages. */
  stop(): Promise<void>
  readonly state: 'running' | 'stopping' | 'stopped'
}

/** Starts the loop at once. */
export function createPullConsumer<T = unknown>(options: PullConsumerOptions<T>): PullConsumer {
  const client = options.client ?? createClient(options.clientOptions)
  const group = options.group
  const maxMessages = options.maxMessages ?? 10
  const waitMs = options.waitMs ?? 20_000
  const onError = options.onError ?? ((err, stage) => console.error(`hookq pull consumer (${stage}):`, err))
  const stopping = new AbortController()
  let state: PullConsumer['state'] = 'running'
  /** The pull under way: cut by stop() until its answer begins (`answered`). */
  let pulling: { cut: AbortController; answered: boolean } | undefined
  const stop = () => {
    if (state === 'running') state = 'stopping'
    stopping.abort()
    if (pulling && !pulling.answered) pulling.cut.abort()
  }
  options.signal?.addEventListener('abort', stop, { once: true })
  const params = { params: { path: { group } } }

  async function settle(m: PulledMessage): Promise<void> {
    // Extend at half the lease, measured from now: the ack deadline says how long the broker gave.
    const leaseMs = Math.max(1000, Date.parse(m.ackDeadline) - Date.now())
    const extendMs = options.leaseMs ?? leaseMs
    const timer = setInterval(
      () => {
        unwrap(client.POST('/v1/groups/{group}/extend', { ...params, body: { deliveryIds: [m.deliveryId], extendMs } })).catch((err) =>
          onError(err, 'extend'),
        )
      },
      Math.max(500, Math.floor(leaseMs / 2)),
    )
    let failed = false
    try {
      await options.handler(m as PulledMessage & { value: T })
    } catch (err) {
      failed = true
      onError(err, 'handler')
    } finally {
      clearInterval(timer)
    }
    try {
      if (failed) {
        const body = { deliveryIds: [m.deliveryId], ...(options.nackDelayMs === undefined ? {} : { delayMs: options.nackDelayMs }) }
        await unwrap(client.POST('/v1/groups/{group}/nacks', { ...params, body }))
      } else {
        await unwrap(client.POST('/v1/groups/{group}/acks', { ...params, body: { deliveryIds: [m.deliveryId] } }))
      }
    } catch (err) {
      // Not settled: the lease expires and the message comes again (an attempt more).
      onError(err, failed ? 'nack' : 'ack')
    }
  }

  async function loop(): Promise<void> {
    let backoffMs = 0
    while (!stopping.signal.aborted) {
      try {
        const body = { maxMessages, waitMs, ...(options.leaseMs === undefined ? {} : { leaseMs: options.leaseMs }) }
        const call = { cut: new AbortController(), answered: false }
        pulling = call
        const answered = { onResponse: () => void (call.answered = true) }
        const { messages } = await unwrap(
          client.POST('/v1/groups/{group}/pull', { ...params, body, signal: call.cut.signal, middleware: [answered] }),
        ).finally(() => {
          pulling = undefined
        })
        backoffMs = 0
        // One pull's messages at once: a partition's order is kept by the broker (ordering), not
        // here. Handled even when stop() came meanwhile: they are leased to this caller.
        await Promise.all(messages.map((m) => settle(m)))
      } catch (err) {
        if (stopping.signal.aborted) break
        onError(err, 'pull')
        backoffMs = Math.min(5000, backoffMs === 0 ? 200 : backoffMs * 2)
        await sleep(backoffMs, stopping.signal)
      }
    }
    state = 'stopped'
  }

  const done = loop()
  return {
    done,
    get state() {
      return state
    },
    stop: async () => {
      stop()
      await done
    },
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms)
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer)
        resolve()
      },
      { once: true },
    )
  })
}

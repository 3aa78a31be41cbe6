/**
 * The consumer side of a hookq push: one request handler for node:http and Fastify that verifies
 * the Standard Webhooks signature, parses the push (envelope or raw), runs your function, and
 * settles the attempt: an ack when it succeeded, a nack with a delay when it threw.
 *
 *   const consumer = createConsumer({ secret, handler: async (message) => { ... } })
 *   http.createServer(consumer.listener)           // node:http
 *   app.register(consumer.fastify, { path: '/h' })   // Fastify (keeps the raw body for the signature)
 *   await consumer.handle({ headers, body })         // anything else: { status, headers, body } to send
 *
 * What each push is answered:
 *   401  the signature, or its timestamp, does not verify        the handler is not run
 *   400  not a hookq push, or one for another group              the handler is not run
 *   413  a body over maxBodyBytes (405: not a POST)              the handler is not run
 *   503  the idempotency store failed                            the handler is not run
 *   200  handled (or a webhook-id already handled) and, in explicit mode, acked
 *   500  the handler threw (after the nack; 503 + Retry-After when nackDelayMs is set and there was
 *        no nack: auto mode, or a nack call that failed), or the ack did not go through
 * Every 4xx and 5xx is a failed attempt for the broker, pushed again after the backoff.
 *
 * A batch push (`{"deliveries": [...]}`, a group with `batch`) is verified as a whole, then each
 * message is handled in turn (or all at once by `batchHandler`), and the answer is 200 with
 * `{"failed": [<deliveryId>, ...]}`: only those are pushed again (see processBatch).
 *
 * With a transactional store as `idempotency` (PgIdempotencyStore), each message's id is recorded
 * in the handler's own transaction (`ctx.tx`) and the ack follows the COMMIT: the handler's effects
 * in that database happen exactly once (see pg-idempotency.ts).
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createClient, HookqError, unwrap, type HookqClient } from './client.ts'
import {
  isTransactional,
  MemoryIdempotencyStore,
  transact,
  type IdempotencyStore,
  type TransactionalIdempotencyStore,
  type TransactOutcome,
} from './idempotency.ts'
import { parsePushes, PushParseError, type PushMessage, type RawPush } from './push.ts'
import { decodeSecret, verifyWebhook, WebhookVerificationError, DEFAULT_TOLERANCE_SECONDS, type HeaderSource } from './verify.ts'

export {
  MemoryIdempotencyStore,
  type IdempotencyStore,
  type MemoryIdempotencyStoreOptions,
  type TransactionalIdempotencyStore,
} from './idempotency.ts'
export {
  DEFAULT_HANDLED_TABLE,
  PgIdempotencyStore,
  type PgClientLike,
  type PgIdempotencyStoreOptions,
  type PgPoolLike,
  type PgResultLike,
} from './pg-idempotency.ts'
export { createPullConsumer, type PullConsumer, type PullConsumerOptions, type PulledMessage } from './pull-consumer.ts'
export { parsePush, parsePushes, PushParseError, type ParsedPush, type PushMessage, type RawPush } from './push.ts'
export {
  SIGNED_HEADERS,
  signedHeaderContent,
  signHeaders,
  signWebhook,
  verifyWebhook,
  WebhookVerificationError,
  type VerifyWebhookOptions,
  type WebhookVerificationReason,
} from './verify.ts'

/** How the group settles pushes: `explicit` (the default) by acks and nacks, `auto` by the push's answer. */
export type AckMode = 'explicit' | 'auto'

/** What the handler gets besides the message. */
export interface ConsumerContext {
  /**
   * Explicit mode: moves this attempt's ack deadline to now + extendMs; resolves with the status
   * (`extended`, or `already_completed` once the deadline passed). The push timeout still applies.
   */
  extend(extendMs: number): Promise<string>
  /** The push's HTTP request headers. */
  requestHeaders: HeaderSource
}

/** The handler's context with a transactional store (`idempotency: new PgIdempotencyStore({ pool })`). */
export interface TransactionalContext<Tx> extends ConsumerContext {
  /**
   * The transaction the message's id is recorded in: write through it, and the writes commit
   * together with the id (then the ack), or roll back with it when the handler throws. Do not
   * COMMIT or ROLLBACK it yourself, nor use it after the handler returns.
   */
  tx: Tx
}

/** The handler's second argument: ConsumerContext, with `tx` when `idempotency` is a transactional store. */
export type HandlerContext<Tx = never> = [Tx] extends [never] ? ConsumerContext : TransactionalContext<Tx>

/** Your function: return to have the message acked, throw to have it pushed again. */
export type PushHandler<T = unknown, Tx = never> = (message: PushMessage<T>, ctx: HandlerContext<Tx>) => Promise<void> | void

/** The batch handler's second argument; `tx` as in TransactionalContext, one transaction for the whole batch. */
export type BatchContext<Tx = never> = [Tx] extends [never] ? { requestHeaders: HeaderSource } : { requestHeaders: HeaderSource; tx: Tx }

/** What a batch handler returns. */
// biome-ignore lint/suspicious/noConfusingVoidType: void lets a handler that returns nothing (Promise<void>) type-check
export type BatchResult = { failed?: readonly string[] } | void

/**
 * Your function for a batch push, all its messages at once (those not handled before, with
 * `idempotency`): return the delivery ids that failed (or nothing: all succeeded); throw to fail
 * them all. The failed ones are pushed again, the others acked. With a transactional store the
 * batch is one transaction, all or nothing: naming any as failed rolls back the whole batch and
 * fails every message of it, since the writes for the others cannot be told apart.
 */
export type BatchHandler<T = unknown, Tx = never> = (
  messages: PushMessage<T>[],
  ctx: BatchContext<Tx>,
) => Promise<BatchResult> | BatchResult

/** Where something went wrong, for `onError`. */
export type ConsumerErrorStage = 'verify' | 'parse' | 'handler' | 'ack' | 'nack' | 'idempotency' | 'internal'

/**
 * `Tx` is the transaction client a transactional `idempotency` store hands the handler (a pg
 * PoolClient for a PgIdempotencyStore on a pg Pool), inferred from the store; `never` without one.
 */
export interface ConsumerOptions<T = unknown, Tx = never> {
  /**
   * Runs per message: for a single push, and for each message of a batch push (in order) unless
   * `batchHandler` is set. With a transactional store, each run is its own transaction.
   */
  handler: PushHandler<T, Tx>
  /** Runs once per batch push instead of `handler` per message (a group with `batch`). */
  batchHandler?: BatchHandler<T, Tx>
  /** The consumer's secret (`whsec_...`), or several while you rotate. Required unless `unsigned: true`. */
  secret?: string | readonly string[]
  /** Accept unsigned pushes (a consumer registered without a secret). Anyone who can reach the URL can then push. */
  unsigned?: boolean
  /** Allowed clock difference for `webhook-timestamp`, s (default 300). */
  toleranceSeconds?: number
  /** The group; a push naming another one is refused (400). Default: the group each push names. */
  group?: string
  /** Must match the group's ackMode. Default `explicit`, which also works with an auto group (the ack comes first). */
  ackMode?: AckMode
  /** The API client for acks and nacks; else one from `baseUrl` and `apiKey` (defaults: HOOKQ_URL, HOOKQ_API_KEY). */
  client?: HookqClient
  baseUrl?: string
  apiKey?: string
  /**
   * How long a failed message waits before it is pushed again, ms, or a function of the error
   * choosing it (undefined: the group's backoff, which grows per attempt). Explicit mode nacks with
   * it; auto mode can only answer 503 with Retry-After (whole seconds, capped at the group's maxDelayMs).
   */
  nackDelayMs?: number | ((error: unknown, message: PushMessage<T>) => number | undefined)
  /**
   * Skip the handler for a webhook-id already handled: `true` for an in-memory store, or your own
   * store; or a transactional store (`new PgIdempotencyStore({ pool })`), which records the id in
   * the same transaction as the handler's writes through `ctx.tx`.
   */
  idempotency?: IdempotencyStore | boolean | TransactionalIdempotencyStore<Tx>
  /** Largest body accepted, bytes (default 2 MiB: the broker's default 1 MiB message plus room). */
  maxBodyBytes?: number
  /**
   * Put the handler's error message (its first 200 characters) in the 500/503 answer (default
   * false). The broker stores answer bodies in the attempt log, which every key with the `consume`
   * scope can read, and an exception's text can carry data or credentials; so by default the
   * answer says only `handler_failed` and the error itself goes to `onError`, on the consumer's side.
   */
  exposeErrors?: boolean
  /** Told of every failure (default: console.error). Must not throw. */
  onError?: (error: unknown, info: { stage: ConsumerErrorStage; message?: PushMessage<T> }) => void
}

/** An answer to send back to the broker. */
export interface ConsumerResponse {
  status: number
  headers: Record<string, string>
  body: string
}

/** The few Fastify instance methods the plugin uses (typed here: this package does not depend on Fastify). */
export interface FastifyInstanceLike {
  removeAllContentTypeParsers(): void
  addContentTypeParser(
    contentType: string,
    options: { parseAs: 'buffer'; bodyLimit?: number },
    parser: (request: unknown, body: Buffer, done: (err: Error | null, body?: unknown) => void) => void,
  ): unknown
  post(
    path: string,
    options: { bodyLimit?: number },
    handler: (request: { headers: HeaderSource; body: unknown }, reply: FastifyReplyLike) => Promise<unknown>,
  ): unknown
}

/** The few Fastify reply methods the plugin uses. */
export interface FastifyReplyLike {
  code(status: number): FastifyReplyLike
  headers(values: Record<string, string>): FastifyReplyLike
  send(payload: string): unknown
}

/** A push consumer: the same logic behind a node:http listener, a Fastify plugin and a plain function. */
export interface Consumer {
  /** Verifies, parses, runs the handler and settles; resolves with the answer to send. Never rejects. */
  handle(push: RawPush): Promise<ConsumerResponse>
  /** A node:http request listener: `http.createServer(consumer.listener)`. Answers POSTs at any path. */
  listener: (req: IncomingMessage, res: ServerResponse) => void
  /**
   * A Fastify plugin: `app.register(consumer.fastify, { path: '/hookq' })` adds `POST path`
   * (default `/`). Inside the plugin's own context it replaces the body parsers with one that keeps
   * the raw bytes, which the signature covers; the app's other routes keep parsing JSON.
   */
  fastify: (instance: FastifyInstanceLike, options: { path?: string }) => Promise<void>
}

/** An environment variable where there is a process (the helper also runs where there is none). */
function processEnv(name: string): string | undefined {
  return (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name]
}

/** Default largest body, bytes. */
export const DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
/** Longest wait for an ack, nack or extend call, ms: below the broker's default push timeout (10 s). */
const API_TIMEOUT_MS = 8000

/**
 * Builds a consumer. Throws a TypeError for a bad configuration (no secret and no `unsigned`, a
 * malformed secret, no handler), so a mistake shows at start-up rather than as 401s.
 *
 * When the answer is sent, in explicit mode: after the ack or nack. The broker settles each attempt
 * once, by whichever comes first of an ack or nack call, the push's answer, and the ack deadline;
 * the later ones are recorded on the attempt but no longer count (an answer to an attempt that is
 * no longer in flight is ignored, and a nack names only the attempt in flight). So:
 * - handler succeeded: ack, then answer 200. The ack is durable when its call returns, so nothing
 *   is lost; if it failed, answer 500: the attempt fails now and the message comes back after the
 *   backoff (the idempotency store then acks it without running the handler again) instead of
 *   waiting out the ack deadline.
 * - handler threw: nack with the delay, then answer 5xx. Answering first would settle the attempt
 *   with the group's backoff and the nack that followed would be refused, its delay lost. If the
 *   nack call fails, the 5xx answer is the failure: counted once either way.
 * In auto mode the answer is the ack: 200 after the handler succeeded, 5xx when it threw.
 * Either way the handler runs while the push is open, so it must finish within the group's
 * pushTimeoutMs (default 10 s); past it the broker counts a timeout and pushes again, and the late
 * ack still completes the message (with idempotency the second push waits for the first here).
 */
export function createConsumer<T = unknown, Tx = never>(options: ConsumerOptions<T, Tx>): Consumer {
  if (typeof options?.handler !== 'function') throw new TypeError('createConsumer needs a handler function')
  const secrets = options.secret === undefined ? [] : typeof options.secret === 'string' ? [options.secret] : [...options.secret]
  if (secrets.length === 0 && options.unsigned !== true) {
    throw new TypeError("createConsumer needs the consumer's `secret` (whsec_...), or `unsigned: true` to accept unsigned pushes")
  }
  for (const s of secrets) decodeSecret(s)
  const ackMode = options.ackMode ?? 'explicit'
  if (ackMode !== 'explicit' && ackMode !== 'auto') throw new TypeError(`ackMode must be "explicit" or "auto", got ${String(ackMode)}`)
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
  if (!Number.isSafeInteger(maxBodyBytes) || maxBodyBytes < 1)
    throw new TypeError(`maxBodyBytes must be a whole number ≥ 1, got ${maxBodyBytes}`)
  const toleranceSeconds = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS
  if (!(Number.isFinite(toleranceSeconds) && toleranceSeconds >= 0))
    throw new TypeError(`toleranceSeconds must be a finite number ≥ 0, got ${toleranceSeconds}`)
  const idempotency = options.idempotency
  const txStore = isTransactional(idempotency) ? idempotency : undefined
  // isTransactional again, not txStore: that is what narrows `idempotency` to a plain store.
  const store =
    idempotency === true
      ? new MemoryIdempotencyStore()
      : idempotency === false || idempotency === undefined || isTransactional(idempotency)
        ? undefined
        : idempotency
  // HandlerContext<Tx> and BatchContext<Tx> are conditional types: ConsumerContext, plus `tx` when
  // there is a transactional store. The contexts built below are always the right one, which
  // TypeScript cannot follow through the condition on an unresolved Tx.
  const handler = options.handler as (message: PushMessage<T>, ctx: ConsumerContext & { tx?: Tx }) => Promise<void> | void
  const batchHandler = options.batchHandler as
    | ((messages: PushMessage<T>[], ctx: { requestHeaders: HeaderSource; tx?: Tx }) => Promise<BatchResult> | BatchResult)
    | undefined
  const report =
    options.onError ??
    ((error, { stage, message }) => {
      console.error(`hookq consumer: ${stage} failed${message ? ` for ${message.webhookId} (attempt ${message.attempt})` : ''}:`, error)
    })
  // Auto mode never calls the API, so it needs no client (nor an API key).
  const client =
    ackMode === 'explicit'
      ? (options.client ??
        createClient({
          ...(options.baseUrl !== undefined ? { baseUrl: options.baseUrl } : {}),
          ...(options.apiKey !== undefined ? { apiKey: options.apiKey } : {}),
        }))
      : undefined
  const keyGiven = options.client ? undefined : (options.apiKey ?? processEnv('HOOKQ_API_KEY') ?? '') !== ''

  /**
   * An ack, nack or extend the broker refused for the key (401/403) is a set-up mistake, not a
   * passing failure: every push would fail and end as a dead letter. Say that, and what to do.
   */
  function explained(err: unknown): unknown {
    if (!(err instanceof HookqError) || (err.status !== 401 && err.status !== 403)) return err
    const why =
      err.status === 403
        ? 'its API key lacks the consume scope (403)'
        : keyGiven === false
          ? 'no API key is set (401)'
          : 'its API key is not valid (401)'
    return new Error(
      `the broker refused this consumer's call: ${why}. Set HOOKQ_API_KEY (or the apiKey option) to a key with ` +
        "the consume scope; until then every push fails and ends as a dead letter after the group's maxDeliveries",
      { cause: err },
    )
  }

  /** Per group/webhook-id, the tail of the pushes of that message being handled here, one after another. */
  const running = new Map<string, Promise<unknown>>()

  /** Calls acks, nacks or extend for one delivery id; resolves with its status. */
  async function settle(
    verb: 'acks' | 'nacks' | 'extend',
    m: PushMessage<T>,
    extra: { delayMs?: number; extendMs?: number },
  ): Promise<string> {
    return (await settleAll(verb, m.group, [m.deliveryId], extra))[0] ?? 'unknown'
  }

  /** Calls acks, nacks or extend for delivery ids of one group, in one call; resolves with their statuses. */
  async function settleAll(
    verb: 'acks' | 'nacks' | 'extend',
    group: string,
    deliveryIds: string[],
    extra: { delayMs?: number; extendMs?: number },
  ): Promise<string[]> {
    if (!client) throw new Error(`${verb} needs ackMode "explicit"`)
    const init = { params: { path: { group } }, signal: AbortSignal.timeout(API_TIMEOUT_MS) }
    const answer =
      verb === 'acks'
        ? await unwrap(client.POST('/v1/groups/{group}/acks', { ...init, body: { deliveryIds } }))
        : verb === 'nacks'
          ? await unwrap(
              client.POST('/v1/groups/{group}/nacks', {
                ...init,
                body: { deliveryIds, ...(extra.delayMs !== undefined ? { delayMs: extra.delayMs } : {}) },
              }),
            )
          : await unwrap(client.POST('/v1/groups/{group}/extend', { ...init, body: { deliveryIds, extendMs: extra.extendMs ?? 0 } }))
    return answer.results.map((r) => r.status)
  }

  /** The delay a failed message is nacked with (undefined: the group's backoff). */
  function delayFor(m: PushMessage<T>, error: unknown): number | undefined {
    let delayMs: number | undefined
    try {
      delayMs = typeof options.nackDelayMs === 'function' ? options.nackDelayMs(error, m) : options.nackDelayMs
    } catch (err) {
      report(err, { stage: 'internal', message: m })
    }
    if (delayMs !== undefined && !(Number.isSafeInteger(delayMs) && delayMs >= 0)) {
      report(new RangeError(`nackDelayMs must be a whole number ≥ 0, got ${delayMs}`), { stage: 'internal', message: m })
      return undefined
    }
    return delayMs
  }

  /** The store key: webhook-ids are per message, the same for every group, so it names the group too. */
  function keyOf(m: PushMessage<T>): string {
    return `${m.group}/${m.webhookId}`
  }

  function contextFor(m: PushMessage<T>, headers: HeaderSource): ConsumerContext {
    return {
      extend: (extendMs) =>
        settle('extend', m, { extendMs }).catch((err: unknown) => {
          throw explained(err)
        }),
      requestHeaders: headers,
    }
  }

  /** A batch's messages handled: those to ack, and those that failed with the stage to report. */
  interface BatchOutcome {
    ok: PushMessage<T>[]
    failed: { m: PushMessage<T>; error: unknown; stage: ConsumerErrorStage }[]
  }

  /**
   * A batch with a plain store (or none): the ids the store has are acked without running anything;
   * the rest go to the handler per message (or the batch handler once). Undefined when `has` failed.
   */
  async function handleBatch(messages: PushMessage<T>[], headers: HeaderSource): Promise<BatchOutcome | undefined> {
    const out: BatchOutcome = { ok: [], failed: [] }
    let todo = messages
    if (store) {
      todo = []
      try {
        for (const m of messages) ((await store.has(keyOf(m))) ? out.ok : todo).push(m)
      } catch (err) {
        report(err, { stage: 'idempotency' })
        return undefined
      }
    }
    if (batchHandler && todo.length > 0) {
      try {
        const named = new Set((await batchHandler(todo, { requestHeaders: headers }))?.failed ?? [])
        for (const m of todo)
          named.has(m.deliveryId)
            ? out.failed.push({ m, error: new Error('named as failed by the batch handler'), stage: 'handler' })
            : out.ok.push(m)
      } catch (err) {
        for (const m of todo) out.failed.push({ m, error: err, stage: 'handler' })
      }
    } else {
      for (const m of todo) {
        try {
          await handler(m, contextFor(m, headers))
          out.ok.push(m)
        } catch (err) {
          out.failed.push({ m, error: err, stage: 'handler' })
        }
      }
    }
    if (store) {
      for (const m of out.ok) {
        try {
          await store.add(keyOf(m))
        } catch (err) {
          report(err, { stage: 'idempotency', message: m })
        }
      }
    }
    return out
  }

  /** The handler on one message, in a transaction of `txs` that records its id. */
  function runInTransaction(
    txs: TransactionalIdempotencyStore<Tx>,
    m: PushMessage<T>,
    headers: HeaderSource,
  ): Promise<TransactOutcome<PushMessage<T>>> {
    return transact(txs, [m], keyOf, (tx) => Promise.resolve(handler(m, { ...contextFor(m, headers), tx })))
  }

  /** The store failed before any work ran (no connection, BEGIN refused): nothing ran, nothing is known. */
  function storeDown(result: TransactOutcome<PushMessage<T>>): boolean {
    return result.kind === 'store' && result.fresh === undefined
  }

  /**
   * A batch with a transactional store. Per message (the handler): each in its own transaction, in
   * order; a store failure fails that message and, not run, the ones after it (the database is
   * likely down), while those committed before it are acked. The batch handler: one transaction for
   * the batch, all or nothing (see BatchHandler).
   */
  async function handleBatchInTransactions(
    txs: TransactionalIdempotencyStore<Tx>,
    messages: PushMessage<T>[],
    headers: HeaderSource,
  ): Promise<BatchOutcome | undefined> {
    const out: BatchOutcome = { ok: [], failed: [] }
    if (batchHandler) {
      const result = await transact(txs, messages, keyOf, async (tx, fresh) => {
        const named = (await batchHandler(fresh, { requestHeaders: headers, tx }))?.failed ?? []
        if (named.length > 0)
          throw new Error(
            `the batch handler named ${named.length} of ${fresh.length} as failed: with a transactional store the batch is rolled back whole`,
          )
      })
      if (storeDown(result)) return undefined
      if (result.kind === 'done') out.ok.push(...messages)
      else {
        const failing = result.fresh ?? messages
        for (const m of messages)
          failing.includes(m)
            ? out.failed.push({ m, error: result.error, stage: result.kind === 'threw' ? 'handler' : 'idempotency' })
            : out.ok.push(m)
      }
    } else {
      for (const [i, m] of messages.entries()) {
        const result = await runInTransaction(txs, m, headers)
        // Nothing committed yet: answered as a failed has() is (503), not as failed messages.
        if (i === 0 && storeDown(result)) return undefined
        if (result.kind === 'done') out.ok.push(m)
        else if (result.kind === 'threw') out.failed.push({ m, error: result.error, stage: 'handler' })
        else {
          for (const later of messages.slice(i)) out.failed.push({ m: later, error: result.error, stage: 'idempotency' })
          break
        }
      }
    }
    return out
  }

  /**
   * A batch push: the handler per message in order (or the batch handler once), then one answer
   * naming the messages that failed (`{"failed": [...]}`), which the broker pushes again. In
   * explicit mode the others are acked first and the failed ones nacked, each by its own delivery
   * id; one whose ack or nack call failed is named as failed too (with idempotency, its second
   * push is acked without running the handler again).
   */
  async function processBatch(messages: PushMessage<T>[], headers: HeaderSource): Promise<ConsumerResponse> {
    const outcome = txStore ? await handleBatchInTransactions(txStore, messages, headers) : await handleBatch(messages, headers)
    if (!outcome) return reply(503, { error: 'idempotency_store_failed' })
    const { ok, failed } = outcome
    for (const { m, error, stage } of failed) report(error, { stage, message: m })
    const answerFailed = new Set(failed.map((f) => f.m.deliveryId))
    if (ackMode === 'explicit') {
      const group = messages[0]!.group
      if (ok.length > 0) {
        try {
          const statuses = await settleAll(
            'acks',
            group,
            ok.map((m) => m.deliveryId),
            {},
          )
          statuses.forEach((status, i) => {
            if (status === 'unknown') answerFailed.add(ok[i]!.deliveryId)
          })
        } catch (err) {
          report(explained(err), { stage: 'ack' })
          for (const m of ok) answerFailed.add(m.deliveryId)
        }
      }
      // Nacked by delay: one call per distinct delay.
      const byDelay = new Map<number | undefined, string[]>()
      for (const { m, error } of failed) {
        const d = delayFor(m, error)
        byDelay.set(d, [...(byDelay.get(d) ?? []), m.deliveryId])
      }
      for (const [delayMs, ids] of byDelay) {
        await settleAll('nacks', group, ids, delayMs === undefined ? {} : { delayMs }).catch((err: unknown) =>
          report(explained(err), { stage: 'nack' }),
        )
      }
    }
    return reply(200, { failed: [...answerFailed] })
  }

  /** The handler succeeded (or had already): ack it, then say so. */
  async function succeeded(m: PushMessage<T>, outcome: 'handled' | 'duplicate'): Promise<ConsumerResponse> {
    if (ackMode === 'auto') return reply(200, { outcome })
    let status: string
    try {
      status = await settle('acks', m, {})
    } catch (err) {
      const reason = explained(err)
      report(reason, { stage: 'ack', message: m })
      return reason === err
        ? reply(500, { error: 'ack_failed', detail: 'handled, but the ack did not go through' })
        : reply(500, { error: 'ack_unauthorized', detail: 'handled, but the broker refused the ack for the API key' })
    }
    // unknown: the broker does not know this delivery (a seek voided it, or the group is gone);
    // failing the attempt is harmless if it is no longer in flight, and retries it if it still is.
    if (status === 'unknown') {
      report(new Error(`the broker does not know delivery ${m.deliveryId} of group ${m.group}`), { stage: 'ack', message: m })
      return reply(500, { error: 'ack_unknown' })
    }
    return reply(200, { outcome, ack: status })
  }

  /**
   * The handler threw (or, `commit_failed`, a transactional store's COMMIT failed after it returned):
   * nack with the delay (explicit mode), then answer 5xx.
   */
  async function failed(
    m: PushMessage<T>,
    error: unknown,
    code: 'handler_failed' | 'commit_failed' = 'handler_failed',
  ): Promise<ConsumerResponse> {
    report(error, { stage: code === 'handler_failed' ? 'handler' : 'idempotency', message: m })
    const delayMs = delayFor(m, error)
    let nacked = false
    if (ackMode === 'explicit') {
      try {
        await settle('nacks', m, delayMs === undefined ? {} : { delayMs })
        nacked = true
      } catch (err) {
        report(explained(err), { stage: 'nack', message: m })
      }
    }
    const detail = options.exposeErrors === true ? { detail: (error instanceof Error ? error.message : String(error)).slice(0, 200) } : {}
    // 503 + Retry-After is how an answer asks for a later retry (auto mode, or a nack that failed).
    // After a nack the answer changes nothing but the push window: a 500 says the message failed,
    // where a 503 would tell the broker this consumer is overloaded and halve its concurrency.
    return delayMs === undefined || nacked
      ? reply(500, { error: code, ...detail })
      : reply(503, { error: code, ...detail }, { 'retry-after': String(Math.ceil(delayMs / 1000)) })
  }

  /**
   * A single push with a transactional store: the id and the handler's writes in one transaction,
   * then the ack. A store that failed before the handler ran is answered as a failed `has` is
   * (503, nothing ran); one that failed at COMMIT fails the message, whose redelivery then finds
   * the id (it committed after all) or runs the handler again (it did not).
   */
  async function processTransactional(
    txs: TransactionalIdempotencyStore<Tx>,
    m: PushMessage<T>,
    headers: HeaderSource,
  ): Promise<ConsumerResponse> {
    const result = await runInTransaction(txs, m, headers)
    if (result.kind === 'done') return succeeded(m, result.fresh.length === 0 ? 'duplicate' : 'handled')
    if (result.kind === 'threw') return failed(m, result.error)
    if (!storeDown(result)) return failed(m, result.error, 'commit_failed')
    report(result.error, { stage: 'idempotency', message: m })
    return reply(503, { error: 'idempotency_store_failed' })
  }

  async function processPush(m: PushMessage<T>, headers: HeaderSource): Promise<ConsumerResponse> {
    if (txStore) return processTransactional(txStore, m, headers)
    const key = keyOf(m)
    if (store) {
      let seen: boolean
      try {
        seen = await store.has(key)
      } catch (err) {
        report(err, { stage: 'idempotency', message: m })
        return reply(503, { error: 'idempotency_store_failed' })
      }
      if (seen) return succeeded(m, 'duplicate')
    }
    try {
      await handler(m, contextFor(m, headers))
    } catch (err) {
      return failed(m, err)
    }
    if (store) {
      try {
        await store.add(key)
      } catch (err) {
        // Acked all the same: the work is done, and a forgotten id only risks a repeat on redelivery.
        report(err, { stage: 'idempotency', message: m })
      }
    }
    return succeeded(m, 'handled')
  }

  async function handle({ headers, body }: RawPush): Promise<ConsumerResponse> {
    try {
      if (byteLength(body) > maxBodyBytes) return reply(413, { error: 'body_too_large', limit: maxBodyBytes })
      if (secrets.length > 0) {
        try {
          // Every push to this consumer comes from hookq: its hookq-* headers must be signed too.
          verifyWebhook({ secrets, headers, body, toleranceSeconds, requireHeaderSignature: true })
        } catch (err) {
          if (!(err instanceof WebhookVerificationError)) throw err
          report(err, { stage: 'verify' })
          return reply(401, { error: 'invalid_signature', reason: err.reason })
        }
      }
      let parsed: { batch: boolean; messages: PushMessage<T>[] }
      try {
        parsed = parsePushes<T>({ headers, body })
      } catch (err) {
        if (!(err instanceof PushParseError)) throw err
        report(err, { stage: 'parse' })
        return reply(400, { error: 'invalid_push', detail: err.message })
      }
      const m = parsed.messages[0]!
      if (options.group !== undefined && parsed.messages.some((x) => x.group !== options.group)) {
        report(new Error(`a push for group ${m.group} reached the consumer of ${options.group}`), { stage: 'parse', message: m })
        return reply(400, { error: 'wrong_group', detail: `this consumer handles group ${options.group}` })
      }
      if (parsed.batch) return await processBatch(parsed.messages, headers)
      if (!store && !txStore) return await processPush(m, headers)
      // Pushes of one message run one after another: a redelivery that arrives while the first push
      // is still being handled (a push timeout) waits for it, then finds its id in the store. (A
      // transactional store would make it wait in its INSERT, holding a second connection.)
      const key = keyOf(m)
      const previous = running.get(key) ?? Promise.resolve()
      const mine = previous.then(() => processPush(m, headers))
      const tail = mine.catch(() => {})
      running.set(key, tail)
      void tail.then(() => {
        if (running.get(key) === tail) running.delete(key)
      })
      return await mine
    } catch (err) {
      report(err, { stage: 'internal' })
      return reply(500, { error: 'internal_error' })
    }
  }

  const listener = (req: IncomingMessage, res: ServerResponse): void => {
    if (req.method !== 'POST') {
      req.resume()
      send(res, reply(405, { error: 'method_not_allowed' }, { allow: 'POST' }))
      return
    }
    readBody(req, maxBodyBytes)
      .then(
        (body) =>
          body === undefined
            ? reply(413, { error: 'body_too_large', limit: maxBodyBytes }, { connection: 'close' })
            : handle({ headers: req.headers, body }),
        () => undefined, // the client went away mid-body: nothing to answer
      )
      .then((r) => {
        if (r) send(res, r)
      })
      .catch((err: unknown) => report(err, { stage: 'internal' }))
  }

  const fastify = async (instance: FastifyInstanceLike, { path = '/' }: { path?: string } = {}): Promise<void> => {
    // Scoped to this plugin's context by Fastify's encapsulation: the app's other routes keep their parsers.
    instance.removeAllContentTypeParsers()
    instance.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: maxBodyBytes }, (_req, body, done) => done(null, body))
    instance.post(path, { bodyLimit: maxBodyBytes }, async (request, res) => {
      const body = Buffer.isBuffer(request.body) || typeof request.body === 'string' ? request.body : ''
      const r = await handle({ headers: request.headers, body })
      return res.code(r.status).headers(r.headers).send(r.body)
    })
  }

  return { handle, listener, fastify }
}

function reply(status: number, body: Record<string, unknown>, headers: Record<string, string> = {}): ConsumerResponse {
  return { status, headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) }
}

function byteLength(body: string | Uint8Array): number {
  return typeof body === 'string' ? Buffer.byteLength(body) : body.byteLength
}

function send(res: ServerResponse, r: ConsumerResponse): void {
  if (res.headersSent || res.destroyed) return
  res.writeHead(r.status, { ...r.headers, 'content-length': String(Buffer.byteLength(r.body)) })
  res.end(r.body)
}

/** The request body, or undefined once it passes `limit` bytes (then the rest is not read). */
function readBody(req: IncomingMessage, limit: number): Promise<Buffer | undefined> {
  const declared = Number(req.headers['content-length'])
  if (declared > limit) return Promise.resolve(undefined)
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    req.on('data', (chunk: Buffer) => {
      size += chunk.length
      if (size > limit) {
        req.removeAllListeners('data')
        req.pause()
        resolve(undefined)
        return
      }
      chunks.push(chunk)
    })
    req.on('end', () => resolve(Buffer.concat(chunks, size)))
    req.on('error', reject)
    req.on('close', () => {
      if (!req.complete) reject(new Error('the request was cut off'))
    })
  })
}

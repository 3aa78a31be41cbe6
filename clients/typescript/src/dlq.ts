/**
 * Bulk produce with retries, and the replay of dead-lettered messages back to their topic.
 *
 * - `produceInBatches` sends any number of messages in calls the broker accepts (at most 1000
 *   messages and `maxBatchBytes` a call), waits out 429/503 answers (their `Retry-After`, capped),
 *   and halves a call the broker finds too large (413 `body_too_large`). Calls go one at a time, so
 *   what is committed before a failure is always a prefix of the input.
 * - `replayDeadLetters` reads a dead-letter topic and produces each dead letter back to the topic
 *   its `hookq-dlq-topic` header names, with its key, value and headers (the `hookq-dlq-*` ones
 *   removed), on its original partition when that topic still has it. Each one carries an
 *   idempotency key derived from where it sits in the dead-letter topic, so a second replay of the
 *   same dead letters (within the target topic's retention) stores nothing new.
 *
 * Only the public HTTP API is used: `GET /v1/topics/{dlq}` for the partitions, the
 * partition reads and produce: a key with the produce scope is enough.
 */
import { HookqError, unwrap, type HookqClient, type Message, type ProduceMessage, type ProduceResult } from './client.ts'

/** The headers the broker adds to a dead letter, naming where it came from. */
export const DLQ_HEADERS = {
  topic: 'hookq-dlq-topic',
  partition: 'hookq-dlq-partition',
  offset: 'hookq-dlq-offset',
  group: 'hookq-dlq-group',
  attempts: 'hookq-dlq-attempts',
  error: 'hookq-dlq-error',
} as const

const DLQ_HEADER_PREFIX = 'hookq-dlq-'
// The broker's limits on one produce call (contract: 1 to 1000 messages; 10 MiB a body by default).
const MAX_CALL_MESSAGES = 1000
const DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
const DEFAULT_RETRIES = 5
// A Retry-After is honoured up to this long; a broker asking for more is treated as asking for this.
const MAX_RETRY_WAIT_MS = 30_000

/** Options for calls that wait out 429 and 503 answers. */
export interface RetryOptions {
  /** Retries of one call after 429/503 answers (default 5); then the last error is thrown. */
  maxRetries?: number
  /** Aborts waits and calls. */
  signal?: AbortSignal
  /** Told before each wait, e.g. to say so on a terminal. */
  onRetry?: (error: HookqError, waitMs: number, attempt: number) => void
}

/**
 * Runs `call` and runs it again, up to `maxRetries` times, while it throws a HookqError with status
 * 429 or 503: after its Retry-After (capped at 30 s), else after 0.5 s, 1 s, 2 s ... Other errors
 * are thrown at once.
 */
export async function withRetries<T>(call: () => Promise<T>, options: RetryOptions = {}): Promise<T> {
  const maxRetries = options.maxRetries ?? DEFAULT_RETRIES
  for (let attempt = 1; ; attempt++) {
    try {
      return await call()
    } catch (err) {
      if (!(err instanceof HookqError) || (err.status !== 429 && err.status !== 503) || attempt > maxRetries) throw err
      const waitMs = Math.min(
        MAX_RETRY_WAIT_MS,
        err.retryAfterSeconds !== undefined ? err.retryAfterSeconds * 1000 : 500 * 2 ** (attempt - 1),
      )
      options.onRetry?.(err, waitMs, attempt)
      await sleep(waitMs, options.signal)
    }
  }
}

/** Options of `produceInBatches`. */
export interface BatchOptions extends RetryOptions {
  /** Messages a call at most (1 to 1000, default 1000). */
  maxBatchMessages?: number
  /** Serialised bytes a call at most (default 4 MiB); a single larger message still goes alone. */
  maxBatchBytes?: number
  /** Called after each committed call with its messages' results, in input order. */
  onCommitted?: (results: ProduceResult[], messages: ProduceMessage[]) => void
}

/**
 * A bulk produce that stopped: `committed` messages (a prefix of the input) were stored before it,
 * then the call of the next `attempted` messages failed. Whether that call stored anything depends
 * on `cause`: a 4xx, 429 or 503 answer means it did not; a lost connection, a timeout or a 500
 * `outcome_unknown` means it may have. Nothing after it was sent.
 */
export class BatchProduceError extends Error {
  override readonly cause: unknown
  /** How many messages, from the first, were durably committed before the failure. */
  readonly committed: number
  /** The input index of the message the broker named as the problem, when it named one. */
  readonly failedIndex: number | undefined
  /** How many messages the failed call carried: inputs `committed` to `committed + attempted - 1`. */
  readonly attempted: number

  constructor(cause: unknown, committed: number, failedIndex: number | undefined, attempted = 0) {
    super(`produce stopped after ${committed} committed messages: ${cause instanceof Error ? cause.message : String(cause)}`)
    this.name = 'BatchProduceError'
    this.cause = cause
    this.committed = committed
    this.failedIndex = failedIndex
    this.attempted = attempted
  }
}

/**
 * Produces `messages` to `topic` in as many calls as it takes, in order, one call at a time.
 * Returns one result per message, in input order; throws BatchProduceError on the first failure.
 */
export async function produceInBatches(
  client: HookqClient,
  topic: string,
  messages: ProduceMessage[],
  options: BatchOptions = {},
): Promise<ProduceResult[]> {
  const maxMessages = Math.max(1, Math.min(MAX_CALL_MESSAGES, options.maxBatchMessages ?? MAX_CALL_MESSAGES))
  const maxBytes = options.maxBatchBytes ?? DEFAULT_BATCH_BYTES
  const results: ProduceResult[] = []

  const send = async (start: number, batch: ProduceMessage[]): Promise<void> => {
    let answer: { results: ProduceResult[] }
    try {
      answer = await withRetries(
        () =>
          unwrap(
            client.POST('/v1/topics/{topic}/messages', {
              params: { path: { topic } },
              body: { messages: batch },
              signal: options.signal,
            }),
          ),
        options,
      )
    } catch (err) {
      // The broker's body limit is its own configuration: halve the call until it fits.
      if (err instanceof HookqError && err.code === 'body_too_large' && batch.length > 1) {
        const half = Math.ceil(batch.length / 2)
        await send(start, batch.slice(0, half))
        await send(start + half, batch.slice(half))
        return
      }
      const index = err instanceof HookqError ? messageIndexOf(err) : undefined
      throw new BatchProduceError(err, results.length, index === undefined ? undefined : start + index, batch.length)
    }
    results.push(...answer.results)
    options.onCommitted?.(answer.results, batch)
  }

  for (const [start, batch] of chunks(messages, maxMessages, maxBytes)) await send(start, batch)
  return results
}

/** Splits messages into runs of at most `maxMessages` and (estimated) `maxBytes`, with each run's start index. */
function* chunks(messages: ProduceMessage[], maxMessages: number, maxBytes: number): Generator<[number, ProduceMessage[]]> {
  const encoder = new TextEncoder()
  let start = 0
  let bytes = 0
  for (let i = 0; i < messages.length; i++) {
    const size = encoder.encode(JSON.stringify(messages[i])).length + 1
    if (i > start && (i - start >= maxMessages || bytes + size > maxBytes)) {
      yield [start, messages.slice(start, i)]
      start = i
      bytes = 0
    }
    bytes += size
  }
  if (start < messages.length) yield [start, messages.slice(start)]
}

/** The message a produce error names: the problem's `index`, or the first validation error's path `/messages/N/...`. */
function messageIndexOf(err: HookqError): number | undefined {
  if (typeof err.problem.index === 'number') return err.problem.index
  const path = err.problem.errors?.[0]?.path
  const m = path === undefined ? null : /^\/messages\/(\d+)/.exec(path)
  return m ? Number(m[1]) : undefined
}

/** Where a dead letter came from, read from its `hookq-dlq-*` headers. */
export interface DeadLetterOrigin {
  topic: string
  partition: number | undefined
  offset: number | undefined
  group: string | undefined
  attempts: number | undefined
  error: string | undefined
}

/** The origin of a dead letter, or undefined when it has no `hookq-dlq-topic` header (not a dead letter). */
export function deadLetterOrigin(message: Pick<Message, 'headers'>): DeadLetterOrigin | undefined {
  const h = message.headers
  const topic = h[DLQ_HEADERS.topic]
  if (topic === undefined || topic === '') return undefined
  return {
    topic,
    partition: wholeNumber(h[DLQ_HEADERS.partition]),
    offset: wholeNumber(h[DLQ_HEADERS.offset]),
    group: h[DLQ_HEADERS.group],
    attempts: wholeNumber(h[DLQ_HEADERS.attempts]),
    error: h[DLQ_HEADERS.error],
  }
}

/**
 * The idempotency key of a replayed dead letter. The dead-letter topic's creation time is part of
 * it, so a topic deleted and created again (whose offsets start over) never collides with its past.
 */
export function replayIdempotencyKey(dlqTopic: string, dlqCreatedAt: string, partition: number, offset: number): string {
  return `hookq-replay:${dlqTopic}@${Date.parse(dlqCreatedAt)}:${partition}:${offset}`
}

/** Options of `replayDeadLetters`. */
export interface ReplayOptions extends RetryOptions {
  /** First offset read in each partition of the dead-letter topic (default 0). */
  fromOffset?: number
  /** Dead letters read at most, all partitions together (default: all up to the end offsets seen at the start). */
  limit?: number
  /** Partitions of the dead-letter topic to read (default all). */
  partitions?: number[]
  /** Read and plan, produce nothing: `replayed` counts what would be produced, `duplicates` what was replayed before. */
  dryRun?: boolean
  /** Dead letters read (and then produced) a round, 1 to 1000 (default 200). */
  batchSize?: number
  /** Told after each round (and once before the first, with nothing done). */
  onProgress?: (progress: ReplayProgress) => void
}

/** How far a replay got. `total` is an upper bound until the end (retention may have removed some). */
export interface ReplayProgress {
  total: number
  read: number
  replayed: number
  duplicates: number
  skipped: number
}

/** One dead letter not replayed, and why. */
export interface ReplaySkip {
  partition: number
  offset: number
  reason: string
}

/** What a replay did (or, with dryRun, would do). */
export interface ReplaySummary extends ReplayProgress {
  dlqTopic: string
  dryRun: boolean
  /** Per target topic: dead letters produced (would be, with dryRun) and those found already replayed. */
  byTopic: Record<string, { replayed: number; duplicates: number }>
  /** The first 100 skipped dead letters; `skipped` counts them all. */
  skips: ReplaySkip[]
  /** Per partition read: where the replay started and the next offset after what it read. */
  partitions: Array<{ partition: number; fromOffset: number; nextOffset: number }>
}

// A replay keeps at most this many skip records; the count covers the rest.
const MAX_SKIP_RECORDS = 100

/**
 * Produces the dead letters of `dlqTopic` back to the topics they came from, reading each partition
 * from `fromOffset` up to the end offset it had when the replay started (dead letters that arrive
 * meanwhile wait for the next replay). Dead letters without a `hookq-dlq-topic` header, or whose
 * topic no longer exists, are skipped and listed. Broker errors other than 429/503 are thrown; what
 * was produced before them stays produced, and running the replay again does not duplicate it.
 */
export async function replayDeadLetters(client: HookqClient, dlqTopic: string, options: ReplayOptions = {}): Promise<ReplaySummary> {
  const retry = { maxRetries: options.maxRetries, signal: options.signal, onRetry: options.onRetry }
  const batchSize = Math.max(1, Math.min(1000, options.batchSize ?? 200))
  const fromOffset = Math.max(0, options.fromOffset ?? 0)
  const dlq = await withRetries(
    () => unwrap(client.GET('/v1/topics/{topic}', { params: { path: { topic: dlqTopic } }, signal: options.signal })),
    retry,
  )
  const wanted = options.partitions ?? dlq.partitionStats.map((s) => s.partition)
  const plan = wanted.map((partition) => {
    const stat = dlq.partitionStats.find((s) => s.partition === partition)
    if (stat === undefined)
      throw new RangeError(
        `topic ${dlqTopic} has ${dlq.partitions} partitions (0 to ${dlq.partitions - 1}); there is no partition ${partition}`,
      )
    return { partition, fromOffset, endOffset: stat.endOffset }
  })
  const available = plan.reduce((n, p) => n + Math.max(0, p.endOffset - p.fromOffset), 0)
  const summary: ReplaySummary = {
    dlqTopic,
    dryRun: options.dryRun === true,
    total: Math.min(available, options.limit ?? Infinity),
    read: 0,
    replayed: 0,
    duplicates: 0,
    skipped: 0,
    byTopic: {},
    skips: [],
    partitions: [],
  }
  const progress = () =>
    options.onProgress?.({
      total: summary.total,
      read: summary.read,
      replayed: summary.replayed,
      duplicates: summary.duplicates,
      skipped: summary.skipped,
    })
  const skip = (m: Message, reason: string) => {
    summary.skipped++
    if (summary.skips.length < MAX_SKIP_RECORDS) summary.skips.push({ partition: m.partition, offset: m.offset, reason })
  }
  const targets = new TargetTopics(client, retry)
  progress()

  for (const p of plan) {
    const done = { partition: p.partition, fromOffset: p.fromOffset, nextOffset: p.fromOffset }
    summary.partitions.push(done)
    while (done.nextOffset < p.endOffset && summary.read < summary.total) {
      const limit = Math.min(batchSize, p.endOffset - done.nextOffset, summary.total - summary.read)
      const page = await withRetries(
        () =>
          unwrap(
            client.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
              params: { path: { topic: dlqTopic, partition: p.partition }, query: { fromOffset: done.nextOffset, limit } },
              signal: options.signal,
            }),
          ),
        retry,
      )
      // Offsets past the end seen at the start are dead letters that arrived during the replay.
      const messages = page.messages.filter((m) => m.offset < p.endOffset)
      if (messages.length === 0) {
        done.nextOffset = p.endOffset
        break
      }
      done.nextOffset = messages.at(-1)!.offset + 1

      const byTarget = new Map<string, ProduceMessage[]>()
      for (const m of messages) {
        summary.read++
        const origin = deadLetterOrigin(m)
        if (origin === undefined) {
          skip(m, `no ${DLQ_HEADERS.topic} header: not a dead letter`)
          continue
        }
        const target = await targets.get(origin.topic)
        if (target === undefined) {
          skip(m, `topic ${origin.topic} does not exist`)
          continue
        }
        const list = byTarget.get(origin.topic) ?? []
        list.push(replayMessage(m, origin, target.partitions, replayIdempotencyKey(dlqTopic, dlq.createdAt, m.partition, m.offset)))
        byTarget.set(origin.topic, list)
      }
      for (const [topic, batch] of byTarget) {
        const counts = (summary.byTopic[topic] ??= { replayed: 0, duplicates: 0 })
        if (summary.dryRun) {
          // The broker's own answer to "would these keys be duplicates?", as a real run's produce gets it.
          const stored = await withRetries(
            () =>
              unwrap(
                client.POST('/v1/topics/{topic}/idempotency-keys', {
                  params: { path: { topic } },
                  body: { keys: batch.map((m) => m.idempotencyKey!) },
                  signal: options.signal,
                }),
              ),
            retry,
          )
          const duplicates = stored.keys.length
          counts.duplicates += duplicates
          counts.replayed += batch.length - duplicates
          summary.duplicates += duplicates
          summary.replayed += batch.length - duplicates
          continue
        }
        await produceInBatches(client, topic, batch, {
          ...retry,
          onCommitted: (results) => {
            const duplicates = results.filter((r) => r.duplicate === true).length
            counts.duplicates += duplicates
            counts.replayed += results.length - duplicates
            summary.duplicates += duplicates
            summary.replayed += results.length - duplicates
          },
        })
      }
      progress()
    }
  }
  summary.total = summary.read
  progress()
  return summary
}

/** The message a dead letter is replayed as: its key, value and own headers, on its first partition when that exists. */
function replayMessage(m: Message, origin: DeadLetterOrigin, targetPartitions: number, idempotencyKey: string): ProduceMessage {
  const headers: Record<string, string> = {}
  for (const [name, value] of Object.entries(m.headers)) {
    if (!name.startsWith(DLQ_HEADER_PREFIX)) headers[name] = value
  }
  const out: ProduceMessage = { value: m.value, headers, idempotencyKey }
  if (m.key !== null) out.key = m.key
  if (origin.partition !== undefined && origin.partition < targetPartitions) out.partition = origin.partition
  return out
}

/** The topics dead letters go back to, each looked up once; undefined for one that does not exist. */
class TargetTopics {
  private readonly known = new Map<string, { partitions: number } | undefined>()
  constructor(
    private readonly client: HookqClient,
    private readonly retry: RetryOptions,
  ) {}

  async get(name: string): Promise<{ partitions: number } | undefined> {
    if (this.known.has(name)) return this.known.get(name)
    let found: { partitions: number } | undefined
    try {
      const topic = await withRetries(
        () => unwrap(this.client.GET('/v1/topics/{topic}', { params: { path: { topic: name } }, signal: this.retry.signal })),
        this.retry,
      )
      found = { partitions: topic.partitions }
    } catch (err) {
      if (!(err instanceof HookqError && err.code === 'topic_not_found')) throw err
    }
    this.known.set(name, found)
    return found
  }
}

function wholeNumber(text: string | undefined): number | undefined {
  return text !== undefined && /^\d{1,15}$/.test(text) ? Number(text) : undefined
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason)
      return
    }
    const onAbort = () => {
      clearTimeout(timer)
      reject(signal!.reason)
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

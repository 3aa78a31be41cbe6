/**
 * The rules of produce: size limits, partition choice, idempotency, all-or-nothing durable commit.
 * A call resolves only after its transaction has committed; then readers are woken directly
 * (in-process), never by NOTIFY, whose global commit lock would serialise every committer.
 */
import { HookqError } from '../core/errors.ts'
import { CommitOutcomeUnknown } from '../core/database-errors.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import type { AppendEntry, Coordinates } from '../store/messages.ts'
import type { GroupCommitter } from './group-commit.ts'
import { partitionForKey, RoundRobin } from '../core/partitioner.ts'
import type { TopicService } from './topics.ts'
import { callTrace, messageTrace, type MessageTrace } from '../core/trace-context.ts'
import { startProduce } from '../dispatch/tracing.ts'

export interface ProduceMessage {
  value: unknown
  key?: string
  headers?: Record<string, string>
  partition?: number
  delayMs?: number
  idempotencyKey?: string
}

/** A produce call's W3C trace context headers, as received (validated here; invalid ones are ignored). */
export interface TraceHeaders {
  traceparent?: string | string[] | undefined
  tracestate?: string | string[] | undefined
}

export interface ProduceResult {
  partition: number
  offset: number
  duplicate?: true
}

/**
 * Told after each commit which partitions grew (topic id, partition, new end offset), with the
 * messages appended there in offset order: the dispatcher pushes them without reading them back.
 */
export type AppendListener = (topicId: number, partition: number, endOffset: number, messages: DispatchMessage[]) => void

export class ProduceService {
  private readonly spread = new RoundRobin()
  private readonly listeners = new Set<AppendListener>()

  constructor(
    private readonly topics: TopicService,
    private readonly committer: GroupCommitter<AppendEntry, Coordinates | null>,
    private readonly maxMessageBytes: number,
  ) {}

  /** Registers a listener for appends; returns a function that removes it. */
  onAppend(listener: AppendListener): () => void {
    this.listeners.add(listener)
    return () => this.listeners.delete(listener)
  }

  /**
   * Durably appends the messages to the topic; results in request order. `callHeaders`: the call's
   * W3C trace context (its HTTP headers), for the messages without a valid one of their own.
   */
  async produce(topicName: string, messages: ProduceMessage[], callHeaders: TraceHeaders = {}): Promise<ProduceResult[]> {
    const topic = await this.topics.require(topicName)
    const trace = callTrace(callHeaders)
    const entries: AppendEntry[] = new Array(messages.length)
    const t: MessageTrace = { traceId: '', traceparent: null, tracestate: null }
    let bytes = 0
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!
      const value = serialise(m.value, i)
      if (m.headers !== undefined) refuseBrokerHeaders(m.headers, i)
      const headers = m.headers === undefined ? '{}' : JSON.stringify(m.headers)
      const key = m.key ?? null
      // A lone UTF-16 surrogate cannot become UTF-8 text; values keep it (as a JSON escape), names cannot.
      if ((key !== null && !key.isWellFormed()) || (m.idempotencyKey !== undefined && !m.idempotencyKey.isWellFormed())) {
        throw new HookqError('invalid_request', `message ${i}: key and idempotencyKey must be valid Unicode (no lone surrogates)`, {
          extra: { index: i },
        })
      }
      const size = Buffer.byteLength(value) + Buffer.byteLength(headers) + (key === null ? 0 : Buffer.byteLength(key))
      if (size > this.maxMessageBytes) {
        throw new HookqError('message_too_large', `message ${i} is ${size} bytes; the limit is ${this.maxMessageBytes} bytes`, {
          extra: { index: i },
        })
      }
      if (m.partition !== undefined && m.partition >= topic.partitions) {
        throw new HookqError(
          'invalid_request',
          `message ${i}: partition ${m.partition} does not exist; topic ${topic.name} has ${topic.partitions} (0 to ${topic.partitions - 1})`,
          { extra: { index: i } },
        )
      }
      const partition = m.partition ?? this.partitionFor(topic.id, topic.partitions, key)
      bytes += size
      messageTrace(m.headers, trace, t)
      entries[i] = {
        topicId: topic.id,
        partition,
        key,
        value,
        headers,
        delayMs: m.delayMs ?? 0,
        idempotencyKey: m.idempotencyKey ?? null,
        traceId: t.traceId,
        traceparent: t.traceparent,
        tracestate: t.tracestate,
      }
    }

    const span = startProduce(topic.name, trace, entries)
    const coordinates = await this.committer.submit(entries, bytes).catch((err: unknown) => {
      span?.end(err)
      if (err instanceof CommitOutcomeUnknown) {
        // Not a 503: "retry, nothing was promised" would be false, and a retry without
        // idempotency keys could store the messages twice.
        throw new HookqError(
          'outcome_unknown',
          'the database connection broke while these messages were being committed: they may or may not be stored. ' +
            'Retrying with the same idempotency keys is safe.',
          { cause: err },
        )
      }
      throw err
    })
    if (coordinates.some((c) => c === null)) {
      // The topic was deleted while the call waited; drop the stale cache entry.
      this.topics.evict(topicName)
      this.spread.forget(topic.id)
      span?.end('the topic was deleted')
      throw new HookqError('topic_not_found', `topic ${topicName} does not exist`)
    }
    span?.end()
    const results = (coordinates as Coordinates[]).map((c) =>
      c.duplicate ? { partition: c.partition, offset: c.offset, duplicate: true as const } : { partition: c.partition, offset: c.offset },
    )
    this.notify(topic.id, entries, coordinates as Coordinates[])
    return results
  }

  /** Where a message without an explicit partition goes: its key's partition, else the next in turn. */
  partitionFor(topicId: number, partitions: number, key: string | null): number {
    return key !== null ? partitionForKey(key, partitions) : this.spread.pick(topicId, partitions)
  }

  /** Tells the append listeners of committed entries (duplicates skipped); also for the outbox's moves. */
  notify(topicId: number, entries: AppendEntry[], coordinates: Coordinates[]): void {
    if (this.listeners.size === 0) return
    const appended = new Map<number, DispatchMessage[]>()
    for (const [i, c] of coordinates.entries()) {
      if (c.duplicate || c.producedAtMs === undefined) continue
      const e = entries[i]!
      let list = appended.get(c.partition)
      if (!list) appended.set(c.partition, (list = []))
      list.push({
        offset: c.offset,
        key: e.key,
        value: e.value,
        headers: e.headers,
        producedAtMs: c.producedAtMs,
        availableAtMs: c.producedAtMs + e.delayMs,
        traceId: e.traceId,
        traceparent: e.traceparent,
        tracestate: e.tracestate,
      })
    }
    for (const [partition, messages] of appended) {
      // Offsets within a partition follow request order, so the list is in offset order already.
      const endOffset = messages.at(-1)!.offset + 1
      for (const listener of this.listeners) listener(topicId, partition, endOffset, messages)
    }
  }
}

/** Headers only the broker writes: a dead letter's origin, which `hookq dlq replay` trusts. */
export const BROKER_HEADER_PREFIX = 'hookq-dlq-'

/**
 * Refuses headers named like the ones the broker puts on a dead letter (any case). A producer able
 * to write them into a dead-letter topic could make a replay produce into a topic it may not
 * write to; refused here, every `hookq-dlq-*` header in a topic was written by the broker.
 */
function refuseBrokerHeaders(headers: Record<string, string>, index: number): void {
  refuseBrokerHeadersOf(headers, `message ${index}`, { index })
}

/** The same rule for any message the broker is asked to make (a schedule's too); `where` names it in the error. */
export function refuseBrokerHeadersOf(headers: Record<string, string>, where: string, extra?: Record<string, unknown>): void {
  for (const name of Object.keys(headers)) {
    if (name.length >= BROKER_HEADER_PREFIX.length && name.slice(0, BROKER_HEADER_PREFIX.length).toLowerCase() === BROKER_HEADER_PREFIX) {
      throw new HookqError(
        'invalid_request',
        `${where}: header ${JSON.stringify(name)} is the broker's own (it says where a dead letter came from); produce cannot set ${BROKER_HEADER_PREFIX}* headers`,
        extra ? { extra } : {},
      )
    }
  }
}

/**
 * A message value as JSON text. A value nested thousands of levels deep parses (the parser is not
 * recursive) but overflows JSON.stringify's stack: that is the caller's input, a 400, not a 500.
 */
function serialise(value: unknown, index: number): string {
  try {
    return JSON.stringify(value)
  } catch (err) {
    if (err instanceof RangeError) {
      throw new HookqError('invalid_request', `message ${index}: value is nested too deeply`, { extra: { index } })
    }
    throw err
  }
}

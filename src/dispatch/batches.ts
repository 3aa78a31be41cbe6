/**
 * Batch push (a group's `batch` setting): the attempts of a partition that are ready to go are
 * gathered here and sent as one POST `{"deliveries": [...]}` when the batch is full (maxMessages),
 * when one more would pass maxBytes, or maxWaitMs after its first attempt was ready (0: the
 * attempts made ready in the same turn of the event loop, which is when a partition fills its room).
 *
 * Only the gathering lives here; what a batch is made of (attempts, each with its delivery id,
 * attempt row and ack deadline) and what its answer does to each belong to the push flow. A
 * batch holds one partition's attempts for one consumer: a partition whose consumer changes
 * sends what it gathered first (compared by id: a reload of the group makes new consumer objects).
 */
import type { ConsumerRow } from '../store/groups.ts'
import type { GroupRuntime, Outstanding, PartitionState } from './partition-state.ts'
import type { Attempt } from './partition.ts'
import type { Timers } from './schedule.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

/** One attempt in a batch: the message, the attempt, its envelope (the single push's body) and traceparent. */
export interface BatchEntry {
  o: Outstanding
  a: Attempt
  envelope: string
  traceparent: string
}

interface Gathering {
  g: GroupRuntime
  consumer: ConsumerRow
  entries: BatchEntry[]
  bytes: number
  timer: unknown
}

/** `{"deliveries":[` and `]}` */
const FRAME_BYTES = 17

export interface BatchesDeps {
  timers: Timers
  /** A batch is complete: send it. */
  send(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, entries: BatchEntry[]): void
  /** A new batch started gathering (it will be one request to `consumer`). */
  opened(consumer: ConsumerRow): void
}

export class Batches {
  private readonly gathering = new Map<PartitionState, Gathering>()

  constructor(private readonly deps: BatchesDeps) {}

  /** Adds an attempt ready to go to its partition's batch, sending the batch when it is complete. */
  add(g: GroupRuntime, w: PartitionState, consumer: ConsumerRow, entry: BatchEntry): void {
    const maxBytes = g.row.batchMaxBytes
    // Bytes matter only against a limit (a comma between envelopes).
    const size = maxBytes === null ? 0 : Buffer.byteLength(entry.envelope) + 1
    let b = this.gathering.get(w)
    if (b && (b.consumer.id !== consumer.id || (maxBytes !== null && b.bytes + size > maxBytes))) {
      this.send(w)
      b = undefined
    }
    if (!b) {
      b = { g, consumer, entries: [], bytes: FRAME_BYTES, timer: undefined }
      this.gathering.set(w, b)
      this.deps.opened(consumer)
      const waitMs = g.row.batchMaxWaitMs
      if (waitMs > 0) b.timer = this.deps.timers.setTimeout(() => this.flush(w, b!), timerDelayMs(waitMs))
      else setImmediate(() => this.flush(w, b!))
    }
    b.entries.push(entry)
    b.bytes += size
    if (b.entries.length >= (g.row.batchMaxMessages ?? 1)) this.send(w)
  }

  /** Whether the partition has a batch gathering for `consumer`: one more attempt joins it, no new request. */
  isOpen(w: PartitionState, consumer: ConsumerRow): boolean {
    return this.gathering.get(w)?.consumer.id === consumer.id
  }

  /** Sends the batch `b` if it is still the one gathering (its timer may outlive it). */
  private flush(w: PartitionState, b: Gathering): void {
    if (this.gathering.get(w) === b) this.send(w)
  }

  private send(w: PartitionState): void {
    const b = this.gathering.get(w)
    if (!b) return
    this.gathering.delete(w)
    if (b.timer !== undefined) this.deps.timers.clearTimeout(b.timer)
    this.deps.send(b.g, w, b.consumer, b.entries)
  }
}

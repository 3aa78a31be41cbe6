/**
 * The in-flight tracker: which pushed messages are waiting for something, and until when.
 *
 * A pure data structure, an index over what PostgreSQL already holds (it can be rebuilt from the
 * attempts table after a restart): a Map from delivery id to entry, plus a min-heap of the same
 * entries by deadline. No I/O, no timers, no clock: methods that need the time take `nowMs`.
 *
 * States of an entry and the calls that move it (verbs as in the HTTP layer: acks → finish,
 * nacks → requeue, extend → touch):
 *
 *   insert ──▶ in_flight ──touch──▶ in_flight            (deadline = the ack deadline, moved)
 *   insert ──▶ retry_wait | delayed | dead_letter_retry   (deadline = when to push, or dead-letter, again)
 *   in_flight ──requeue──▶ retry_wait
 *   either ──finish / expireDue──▶ untracked (the caller gets the entry back)
 *
 * All kinds share one heap. The dispatcher keeps only in_flight entries here, the ack deadlines of
 * delivery ids (src/dispatch/schedule.ts arms one timer for them and for the waits of messages,
 * which are typed entries of src/dispatch/waits.ts, not delivery ids); the other kinds and
 * `requeue` remain for a caller that keeps waits by id.
 *
 * Cost, measured by bench/tracker.ts with 1,000,000 entries (Node 20, 64-bit, no pointer
 * compression): ~144 bytes an entry right after filling (entry object with its boxed deadline 88,
 * Map slot ~21-29, heap slot ~19 with the key array), ~166 once the Map has seen as many deletes
 * (it keeps a table twice as large), plus the delivery id string the caller allocates (~48 for
 * 22 chars). Most of the time per operation goes to the Map's random memory accesses and to
 * allocating entries: with the heap replaced by a no-op, the mixed workload ran only ~1.4-1.6×
 * faster.
 */
import { MinHeap, type HeapEntry } from './min-heap.ts'

/**
 * What an entry is waiting for: an ack (`in_flight`), the end of its retry backoff (`retry_wait`),
 * its produce delay (`delayed`), or another try at dead-lettering it (`dead_letter_retry`). All but
 * `in_flight` are waits the dispatcher schedules; only `in_flight` entries can be touched or requeued.
 */
export type DeliveryKind = 'in_flight' | 'retry_wait' | 'delayed' | 'dead_letter_retry'
const KINDS: readonly DeliveryKind[] = ['in_flight', 'retry_wait', 'delayed', 'dead_letter_retry']

/** The fields of a new entry. */
export interface TrackerEntryInit {
  deliveryId: string
  groupId: number
  partition: number
  offset: number
  attempt: number
  deadlineMs: number
  kind: DeliveryKind
}

/** Attempts above this do not fit the packed field (a Smi, 31 bits); maxDeliveries is far lower. */
const MAX_ATTEMPT = 2 ** 28

/**
 * One tracked delivery. A class with fixed fields so that a million of them share one hidden
 * class and cost ~96 bytes each (with the boxed deadline); an object literal per entry would cost
 * more and vary in shape. `deadlineMs`, `kind` and `index` belong to the tracker: change them only
 * through its methods while the entry is tracked (an untracked entry may be edited, then inserted).
 */
export class TrackerEntry implements HeapEntry {
  // `declare`: no class-field initialisers, so V8 first sees each field with its real type. A field
  // defined as undefined first would hold deadlineMs as a fresh HeapNumber on every write
  // (measured: 12 ns instead of 5 ns a write, plus garbage); this way it is updated in place.
  declare readonly deliveryId: string
  declare readonly groupId: number
  declare readonly partition: number
  declare readonly offset: number
  /** Epoch ms: the ack deadline (in_flight) or when to push again (retry_wait). */
  declare deadlineMs: number
  /** Heap position, maintained by the heap; -1 when not tracked. */
  declare index: number
  /** attempt * 4 plus the kind's index in KINDS: one small integer instead of two fields, 8 bytes less an entry. */
  declare private attemptAndKind: number

  constructor(init: TrackerEntryInit) {
    if (!Number.isInteger(init.attempt) || init.attempt < 0 || init.attempt > MAX_ATTEMPT) {
      throw new RangeError(`attempt must be an integer from 0 to ${MAX_ATTEMPT}, got ${init.attempt}`)
    }
    this.deliveryId = init.deliveryId
    this.groupId = init.groupId
    this.partition = init.partition
    this.offset = init.offset
    this.deadlineMs = init.deadlineMs
    this.index = -1
    this.attemptAndKind = init.attempt * 4 + KINDS.indexOf(init.kind)
  }

  /** The attempt this delivery id names (1 for the first push). */
  get attempt(): number {
    return this.attemptAndKind >> 2
  }

  /** What the entry waits for; set only while untracked, or through the tracker's requeue. */
  get kind(): DeliveryKind {
    return KINDS[this.attemptAndKind & 3]!
  }

  set kind(kind: DeliveryKind) {
    this.attemptAndKind = (this.attemptAndKind & ~3) | KINDS.indexOf(kind)
  }
}

/** What {@link InFlightTracker.expireDue} returns. */
export interface ExpireResult {
  /** Removed entries whose deadline was ≤ nowMs, earliest first (ties in no particular order). */
  due: TrackerEntry[]
  /** The earliest deadline still tracked; undefined when empty. ≤ nowMs when `limit` cut the batch short. */
  nextDeadlineMs: number | undefined
}

/** Map by delivery id plus min-heap by deadline; every operation by id is O(1) + O(log n). */
export class InFlightTracker {
  private readonly byId = new Map<string, TrackerEntry>()
  private readonly heap = new MinHeap<TrackerEntry>()
  private inFlight = 0

  /** Entries tracked, both kinds. */
  get size(): number {
    return this.byId.size
  }

  /** Entries waiting for an ack. */
  get inFlightCount(): number {
    return this.inFlight
  }

  /** Entries waiting for their retry backoff. */
  get retryWaitCount(): number {
    return this.byId.size - this.inFlight
  }

  /** Starts tracking an entry and returns it; throws if its delivery id is tracked or the entry is in a heap. */
  insert(entry: TrackerEntry): TrackerEntry {
    if (this.byId.has(entry.deliveryId)) throw new Error(`delivery ${entry.deliveryId} is already tracked`)
    this.heap.push(entry) // throws before the Map changes if the entry is tracked elsewhere
    this.byId.set(entry.deliveryId, entry)
    if (entry.kind === 'in_flight') this.inFlight++
    return entry
  }

  /** The tracked entry for a delivery id, or undefined. */
  get(deliveryId: string): TrackerEntry | undefined {
    return this.byId.get(deliveryId)
  }

  /** True when the delivery id is tracked. */
  has(deliveryId: string): boolean {
    return this.byId.has(deliveryId)
  }

  /** Stops tracking a delivery of either kind (ack, dead-letter); returns the removed entry or undefined. */
  finish(deliveryId: string): TrackerEntry | undefined {
    const entry = this.byId.get(deliveryId)
    if (entry === undefined) return undefined
    this.forget(entry)
    return entry
  }

  /**
   * Moves an in_flight entry's ack deadline (extend). False for an unknown id and for a retry_wait
   * entry: its attempt already ended (timed out, failed or nacked), so there is no deadline to extend.
   */
  touch(deliveryId: string, deadlineMs: number): boolean {
    const entry = this.byId.get(deliveryId)
    if (entry === undefined || entry.kind !== 'in_flight') return false
    this.heap.update(entry, deadlineMs)
    return true
  }

  /** Turns an in_flight entry into retry_wait until `retryAtMs` (nack); false for an unknown id or one already waiting. */
  requeue(deliveryId: string, retryAtMs: number): boolean {
    const entry = this.byId.get(deliveryId)
    if (entry === undefined || entry.kind !== 'in_flight') return false
    entry.kind = 'retry_wait'
    this.inFlight--
    this.heap.update(entry, retryAtMs)
    return true
  }

  /**
   * Removes and returns the entries whose deadline is ≤ nowMs, earliest first, at most `limit` of
   * them (a bound on the work of one timer tick), and says when the next one falls due.
   */
  expireDue(nowMs: number, limit = Infinity): ExpireResult {
    if (!(limit >= 0)) throw new RangeError(`limit must be ≥ 0, got ${limit}`)
    const due: TrackerEntry[] = []
    const heap = this.heap
    let next = heap.peek()
    while (next !== undefined && next.deadlineMs <= nowMs && due.length < limit) {
      heap.pop()
      this.byId.delete(next.deliveryId)
      if (next.kind === 'in_flight') this.inFlight--
      due.push(next)
      next = heap.peek()
    }
    return { due, nextDeadlineMs: next?.deadlineMs }
  }

  /** The earliest deadline tracked, or undefined when empty: when the dispatcher's one timer should fire. */
  nextDeadlineMs(): number | undefined {
    return this.heap.peek()?.deadlineMs
  }

  /** Throws when the Map, the heap and the counters disagree. O(n): for tests and debugging. */
  checkInvariant(): void {
    this.heap.checkInvariant()
    if (this.heap.size !== this.byId.size) throw new Error(`heap has ${this.heap.size} entries, map ${this.byId.size}`)
    let inFlight = 0
    for (const [deliveryId, entry] of this.byId) {
      if (entry.deliveryId !== deliveryId) throw new Error(`map key ${deliveryId} holds entry ${entry.deliveryId}`)
      if (!this.heap.contains(entry)) throw new Error(`entry ${deliveryId} is not in the heap`)
      if (entry.kind === 'in_flight') inFlight++
    }
    if (inFlight !== this.inFlight) throw new Error(`inFlightCount says ${this.inFlight}, counted ${inFlight}`)
  }

  private forget(entry: TrackerEntry): void {
    this.heap.remove(entry)
    this.byId.delete(entry.deliveryId)
    if (entry.kind === 'in_flight') this.inFlight--
  }
}

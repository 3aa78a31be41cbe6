/**
 * The in-flight tracker: the ack deadlines of the pushes in flight, one per delivery id.
 *
 * A pure data structure, an index over what PostgreSQL already holds (the attempts table has each
 * attempt's ack deadline): a Map from delivery id to entry, plus a min-heap of the same entries by
 * deadline. No I/O, no timers, no clock: methods that need the time take `nowMs`.
 * src/dispatch/schedule.ts owns the one tracker and arms one timer for its earliest deadline and
 * for the earliest wait (src/dispatch/waits.ts).
 *
 * The calls, by what happens to a push (the dispatcher makes them through the schedule):
 *
 *   pushed                  → insert     an entry with the attempt's ack deadline (explicit mode;
 *                                        in auto mode only if it can pass before the push's timeout,
 *                                        or when the attempt is extended)
 *   acked                   → finish     no longer tracked
 *   extended                → touch      the deadline moved, earlier or later
 *   nacked                  → finish     then the push flow schedules the retry as a wait in
 *                                        waits.ts (or dead-letters the message): no requeue here
 *   settled otherwise       → finish     the push failed, an auto-mode push was answered, the
 *                                        message was dead-lettered or its partition moved
 *   the deadline passed     → expireDue  removed and handed back, earliest first; the push flow
 *                                        records the timeout and schedules the retry as a wait
 *
 * Cost: about 144 bytes an entry plus the caller's delivery id string; an operation by id costs
 * about 2-4 random Map lookups, far below a push's cost (docs/performance.md#the-in-flight-tracker).
 */
import { MinHeap, type HeapEntry } from './min-heap.ts'

/** The fields of a new entry. */
export interface TrackerEntryInit {
  deliveryId: string
  groupId: number
  partition: number
  offset: number
  attempt: number
  deadlineMs: number
}

/**
 * The ack deadline of one delivery id. A class with fixed fields so that a million of them share
 * one hidden class (88 bytes each with the boxed deadline); an object literal per entry would cost
 * more and vary in shape. `deadlineMs` and `index` belong to the tracker: change them only through
 * its methods while the entry is tracked (an untracked entry may be edited, then inserted).
 */
export class TrackerEntry implements HeapEntry {
  // `declare`: no class-field initialisers, so V8 first sees each field with its real type. A field
  // defined as undefined first would hold deadlineMs as a fresh HeapNumber on every write (twice
  // the time of a write, plus garbage); this way it is updated in place.
  declare readonly deliveryId: string
  declare readonly groupId: number
  declare readonly partition: number
  declare readonly offset: number
  /** The attempt this delivery id names (1 for the first push). */
  declare readonly attempt: number
  /** Epoch ms: the ack deadline. */
  declare deadlineMs: number
  /** Heap position, maintained by the heap; -1 when not tracked. */
  declare index: number

  constructor(init: TrackerEntryInit) {
    this.deliveryId = init.deliveryId
    this.groupId = init.groupId
    this.partition = init.partition
    this.offset = init.offset
    this.attempt = init.attempt
    this.deadlineMs = init.deadlineMs
    this.index = -1
  }
}

/** Map by delivery id plus min-heap by deadline; every operation by id is O(1) + O(log n). */
export class InFlightTracker {
  private readonly byId = new Map<string, TrackerEntry>()
  private readonly heap = new MinHeap<TrackerEntry>()

  // size and has: the broker asks neither (it holds the entry it inserted, in Attempt.deadline),
  // but a Map answers them in O(1), and the model-based test compares the tracked set with its
  // model through them after every operation.

  /** Delivery ids tracked. */
  get size(): number {
    return this.byId.size
  }

  /** True when the delivery id is tracked. */
  has(deliveryId: string): boolean {
    return this.byId.has(deliveryId)
  }

  /** Starts tracking an entry and returns it; throws if its delivery id is tracked or the entry is in a heap. */
  insert(entry: TrackerEntry): TrackerEntry {
    if (this.byId.has(entry.deliveryId)) throw new Error(`delivery ${entry.deliveryId} is already tracked`)
    this.heap.push(entry) // throws before the Map changes if the entry is tracked elsewhere
    this.byId.set(entry.deliveryId, entry)
    return entry
  }

  /** Stops tracking a delivery id (its attempt was acked, nacked or otherwise settled); false when it was not tracked. */
  finish(deliveryId: string): boolean {
    const entry = this.byId.get(deliveryId)
    if (entry === undefined) return false
    this.heap.remove(entry)
    this.byId.delete(deliveryId)
    return true
  }

  /**
   * Moves a delivery id's ack deadline, earlier or later (extend). False for an id not tracked: its
   * attempt already ended (acked, nacked, failed or timed out), so there is no deadline to extend.
   */
  touch(deliveryId: string, deadlineMs: number): boolean {
    const entry = this.byId.get(deliveryId)
    if (entry === undefined) return false
    this.heap.update(entry, deadlineMs)
    return true
  }

  /**
   * Removes and returns the entries whose deadline is ≤ nowMs, earliest first (ties in no particular
   * order), at most `limit` of them: a bound on the work of one timer tick. When the limit cut the
   * batch short, nextDeadlineMs() is ≤ nowMs.
   */
  expireDue(nowMs: number, limit = Infinity): TrackerEntry[] {
    if (!(limit >= 0)) throw new RangeError(`limit must be ≥ 0, got ${limit}`)
    const due: TrackerEntry[] = []
    const heap = this.heap
    for (let next = heap.peek(); next !== undefined && next.deadlineMs <= nowMs && due.length < limit; next = heap.peek()) {
      heap.pop()
      this.byId.delete(next.deliveryId)
      due.push(next)
    }
    return due
  }

  /** The earliest deadline tracked, or undefined when empty: when the schedule's one timer should fire. */
  nextDeadlineMs(): number | undefined {
    return this.heap.peek()?.deadlineMs
  }

  /**
   * Throws when the Map and the heap disagree (or the heap's own order or indexes are wrong). O(n),
   * and no caller in src/ needs it: a test hook, kept because this is a pure structure whose two
   * halves must hold the same entries, and the model-based test checks that after every operation.
   */
  checkInvariant(): void {
    this.heap.checkInvariant()
    if (this.heap.size !== this.byId.size) throw new Error(`heap has ${this.heap.size} entries, map ${this.byId.size}`)
    for (const [deliveryId, entry] of this.byId) {
      if (entry.deliveryId !== deliveryId) throw new Error(`map key ${deliveryId} holds entry ${entry.deliveryId}`)
      if (!this.heap.contains(entry)) throw new Error(`entry ${deliveryId} is not in the heap`)
    }
  }
}

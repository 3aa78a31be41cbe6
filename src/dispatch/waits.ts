/**
 * What outstanding messages wait for besides an ack: the end of their produce delay (`delay`), of a
 * retry's backoff (`retry`), or the next try at dead-lettering after a failed one
 * (`dead_letter_retry`). Each is a typed entry in one min-heap by deadline; the entry names its
 * message by (group, partition, offset), and the message holds its entry, so cancelling is
 * O(log n). Ack deadlines are not here: they belong to delivery ids, in the in-flight tracker
 * (tracker.ts). A pure structure: no clock, no timers (the schedule arms one timer for both).
 */
import { MinHeap, type HeapEntry } from './min-heap.ts'

export type WaitKind = 'delay' | 'retry' | 'dead_letter_retry'

/** One message's wait. */
export class Wait implements HeapEntry {
  declare readonly kind: WaitKind
  declare readonly groupId: number
  declare readonly partition: number
  declare readonly offset: number
  /** Epoch ms: when the wait ends. */
  declare deadlineMs: number
  /** Heap position, maintained by the heap; -1 when not queued. */
  declare index: number

  constructor(kind: WaitKind, groupId: number, partition: number, offset: number, deadlineMs: number) {
    this.kind = kind
    this.groupId = groupId
    this.partition = partition
    this.offset = offset
    this.deadlineMs = deadlineMs
    this.index = -1
  }
}

export class WaitQueue {
  private readonly heap = new MinHeap<Wait>()

  /** Waits queued. */
  get size(): number {
    return this.heap.size
  }

  /** Queues a wait and returns it. */
  add(wait: Wait): Wait {
    this.heap.push(wait)
    return wait
  }

  /** Removes a wait before it ends; false when it was not queued (it ended, or was cancelled). */
  cancel(wait: Wait): boolean {
    return this.heap.remove(wait)
  }

  /** When the earliest wait ends; undefined when none is queued. */
  nextDeadlineMs(): number | undefined {
    return this.heap.peek()?.deadlineMs
  }

  /** Removes and returns the waits ending at or before `nowMs`, earliest first, at most `limit`. */
  takeDue(nowMs: number, limit = Infinity): Wait[] {
    const due: Wait[] = []
    for (let next = this.heap.peek(); next !== undefined && next.deadlineMs <= nowMs && due.length < limit; next = this.heap.peek()) {
      this.heap.pop()
      due.push(next)
    }
    return due
  }
}

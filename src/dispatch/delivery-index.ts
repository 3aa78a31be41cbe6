/**
 * Which message a delivery id names, for the acks, nacks and extends of ids this process issued:
 * ids of outstanding messages (until their message completes), then the ids of recently completed
 * messages, so that a repeated ack answers `already_completed` from memory even before the attempt
 * row is written. A pure structure: no I/O, no clock.
 */
import type { GroupRuntime, PartitionState } from './partition-state.ts'

/** Where an issued id points. */
export interface IssuedId {
  g: GroupRuntime
  w: PartitionState
  offset: number
}

export class DeliveryIndex {
  private readonly issued = new Map<string, IssuedId>()
  /** Ids of completed messages → their partition (a seek replaces it, and so voids them). */
  private readonly recent = new Map<string, PartitionState>()
  /**
   * The same ids in the order they were remembered, a ring of `recentCapacity`: the oldest is
   * forgotten through it, not by iterating the Map, whose deleted entries stay as holes at its
   * front until it rehashes (each iteration skipped up to ~100k of them: 8% of the CPU with acks
   * over HTTP).
   */
  private readonly ring: string[] = []
  private next = 0

  /** `recentCapacity`: completed ids remembered (~100 bytes each). */
  constructor(private readonly recentCapacity: number) {}

  /** A new id for an attempt of the message at `at`. */
  issue(id: string, at: IssuedId): void {
    this.issued.set(id, at)
  }

  /** Where an id issued for an outstanding message points. */
  find(id: string): IssuedId | undefined {
    return this.issued.get(id)
  }

  /** Forgets an id whose attempt never went out. */
  withdraw(id: string): void {
    this.issued.delete(id)
  }

  /** The message was abandoned (seek, group change): its ids answer `unknown` from now on. */
  abandon(ids: Iterable<string>): void {
    for (const id of ids) this.issued.delete(id)
  }

  /**
   * The message completed: its ids answer `already_completed` from memory (the oldest forgotten
   * past capacity) when `remember`; otherwise they are only forgotten, and a repeated ack is answered
   * from the attempt log.
   */
  complete(ids: Iterable<string>, w: PartitionState, remember = true): void {
    for (const id of ids) {
      this.issued.delete(id)
      if (!remember) continue
      if (this.ring.length < this.recentCapacity) {
        this.ring.push(id)
      } else {
        this.recent.delete(this.ring[this.next]!)
        this.ring[this.next] = id
        this.next = (this.next + 1) % this.recentCapacity
      }
      this.recent.set(id, w)
    }
  }

  /** Whether `id` belongs to a message of `g` completed recently (and not before a seek of its partition). */
  completedRecently(g: GroupRuntime | undefined, id: string): boolean {
    const w = this.recent.get(id)
    return g !== undefined && w !== undefined && !w.dropped && g.parts.get(w.partition) === w
  }
}

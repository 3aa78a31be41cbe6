/**
 * Which message a delivery id names, for the ids this process issued and whose message is still
 * outstanding. Once the message completes (or is abandoned) its ids are forgotten: a later ack,
 * nack or extend of one is answered from its attempt row (see ack-handler.ts), which says as much
 * and costs nothing per push. A pure structure: no I/O, no clock.
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

  /** A new id for an attempt of the message at `at`. */
  issue(id: string, at: IssuedId): void {
    this.issued.set(id, at)
  }

  /** Where an id issued for an outstanding message points. */
  find(id: string): IssuedId | undefined {
    return this.issued.get(id)
  }

  /** The ids' message completed or was abandoned, or the attempt never went out: they are forgotten. */
  forget(ids: Iterable<string>): void {
    for (const id of ids) this.issued.delete(id)
  }
}

/**
 * Consumers disabled here (410 Gone) whose disabling a group's reload may not see yet.
 *
 * A 410 disables its consumer in memory at once, so the retry that follows goes elsewhere, and then
 * writes it to the database. A reload of the group (a periodic reconcile, another change's
 * notification) that reads the consumers before that write commits would bring the consumer back
 * as enabled, and the retry would go to it after all. So each disable is kept here and laid over
 * what reloads read, until a reload that began after its write committed: from then on the
 * database has it, and what reloads read is the record again.
 *
 * Reloads are numbered as they begin; a write remembers the number reached when it committed.
 */
import type { ConsumerRow } from '../store/groups.ts'

interface Disable {
  groupId: number
  at: Date
  reason: string
  /** The number of reloads begun when the write committed; undefined while it is under way. */
  committedAtLoad: number | undefined
}

export class PendingDisables {
  private readonly byConsumer = new Map<string, Disable>()
  private loads = 0

  /** A reload begins: the number to hand to `apply` with what it read. */
  beginLoad(): number {
    return ++this.loads
  }

  /**
   * Records a disable and runs its write. A write that fails is forgotten here (the database still
   * has the consumer enabled, and the next reload says so), and its error passed on.
   */
  async disable(groupId: number, consumerId: string, reason: string, at: Date, write: () => Promise<void>): Promise<void> {
    const d: Disable = { groupId, at, reason, committedAtLoad: undefined }
    this.byConsumer.set(consumerId, d)
    try {
      await write()
      d.committedAtLoad = this.loads
    } catch (err) {
      if (this.byConsumer.get(consumerId) === d) this.byConsumer.delete(consumerId)
      throw err
    }
  }

  /**
   * Lays the group's pending disables over the consumers reload number `load` read (in place), and
   * forgets those the read came late enough to have seen.
   */
  apply(groupId: number, load: number, consumers: ConsumerRow[]): void {
    if (this.byConsumer.size === 0) return
    for (const [id, d] of this.byConsumer)
      if (d.groupId === groupId && d.committedAtLoad !== undefined && load > d.committedAtLoad) this.byConsumer.delete(id)
    for (const c of consumers) {
      const d = this.byConsumer.get(c.id)
      if (d && d.groupId === groupId && c.disabledAt === null) {
        c.disabledAt = d.at
        c.disabledReason = d.reason
      }
    }
  }
}

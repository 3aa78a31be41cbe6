/**
 * Ordering by key (a group's `ordering: "key"`), for one partition: at most one message of a key
 * outstanding (pushed, or waiting for its delay, a retry or its completion), later messages of the
 * key waiting their turn here, in offset order, while other keys flow. A message without a key is
 * not ordered with anything. A pure structure: the push flow admits what `take` and `release` hand it.
 *
 * The rule survives a restart, a seek and a handover without any state of its own: messages are
 * taken in offset order from the committed offset, so the first message of a key that is not
 * completed is always the one outstanding.
 */
import type { DispatchMessage } from '../core/dispatch-message.ts'

export class KeyOrder {
  /** Keys with messages outstanding, and how many (more than one only after a switch to this ordering). */
  private readonly busy = new Map<string, number>()
  /** Later messages of busy keys, oldest first. */
  private readonly waiting = new Map<string, DispatchMessage[]>()
  /** Messages waiting, over all keys (bounded by the caller, which stops reading). */
  queued = 0

  /** Whether a message of this key would wait behind another now. */
  isBusy(key: string): boolean {
    return this.busy.has(key)
  }

  /**
   * Counts a message already outstanding when the group switched to this ordering: its key's
   * later messages wait until it (and any other already out) completes.
   */
  hold(key: string): void {
    this.busy.set(key, (this.busy.get(key) ?? 0) + 1)
  }

  /** True when the message may go out now (its key is taken for it); false when it waits behind its key. */
  take(msg: DispatchMessage): boolean {
    const key = msg.key
    if (key === null) return true
    if (!this.busy.has(key)) {
      this.busy.set(key, 1)
      return true
    }
    const q = this.waiting.get(key)
    if (q) q.push(msg)
    else this.waiting.set(key, [msg])
    this.queued++
    return false
  }

  /**
   * An outstanding message of `key` is completed (acked, dead-lettered, or filtered): returns the
   * key's next message, which holds the key from now on, or undefined when the key is still held
   * by another or none waits (then the key is free).
   */
  release(key: string): DispatchMessage | undefined {
    const held = this.busy.get(key) ?? 0
    if (held > 1) {
      this.busy.set(key, held - 1)
      return undefined
    }
    const q = this.waiting.get(key)
    const next = q?.shift()
    if (next) {
      this.queued--
      if (q!.length === 0) this.waiting.delete(key)
      return next
    }
    this.busy.delete(key)
    return undefined
  }

  /** The lowest offset waiting behind its key (Infinity when none waits). */
  lowestWaiting(): number {
    let low = Infinity
    for (const q of this.waiting.values()) if (q[0] !== undefined && q[0].offset < low) low = q[0].offset
    return low
  }

  /** Every waiting message, in offset order, and forgets everything (the group left this ordering). */
  drain(): DispatchMessage[] {
    const all = [...this.waiting.values()].flat().sort((a, b) => a.offset - b.offset)
    this.waiting.clear()
    this.busy.clear()
    this.queued = 0
    return all
  }
}

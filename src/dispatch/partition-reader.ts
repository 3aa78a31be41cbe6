/**
 * How a partition's buffer gets its messages, in offset order: read from the log in batches from
 * the next offset to take (`read`), or, for what this process's own produce has just committed,
 * handed over directly (`takeTail`), which saves reading back what was just written. Offsets are
 * dense, so a hole in what a read returns is retention at work: recorded in `gaps`, which count as
 * completed (the committed offset may pass them).
 */
import type { DispatchMessage } from '../store/consumption.ts'
import { readForDispatch } from '../store/consumption.ts'
import type { Database } from '../store/db.ts'
import type { GroupRuntime, PartitionState } from './partition-state.ts'
import type { Timers } from './schedule.ts'

/** Messages read from the log at a time. */
export const READ_BATCH = 200
/**
 * A partition's buffer is topped up by a read once it holds fewer than this: the read's round trip
 * then overlaps the pushes of what is left, instead of holding the partition between the last
 * message and the next read (batches of 100 under maxInFlight 200 waited for a read every cycle).
 */
export const READ_AHEAD = READ_BATCH / 2
/** Messages a partition's buffer takes from produce directly (see takeTail). */
const MAX_TAIL = 2000

export interface PartitionReaderDeps {
  db: Database
  timers: Timers
  log: { error(obj: object, msg: string): void }
  /** The buffer has new messages (or a read failed and it is time to try again): push what can go. */
  onReadable(g: GroupRuntime, w: PartitionState): void
}

export class PartitionReader {
  constructor(private readonly deps: PartitionReaderDeps) {}

  /**
   * Reads the next batch into the buffer, after what it holds, unless a read is under way or
   * nothing more is known to be there. Called when the buffer runs empty, and ahead of that, when
   * it runs low (see READ_AHEAD), so a partition keeping its window full does not stop to read.
   */
  read(g: GroupRuntime, w: PartitionState): void {
    const from = nextToRead(w)
    if (w.reading || from >= w.endHint) return
    void this.readBatch(g, w, from)
  }

  /**
   * Appends freshly produced messages to the partition's buffer when they follow on from it
   * exactly. Otherwise (a read under way, or messages before them not read yet) the log has them
   * and they are read as usual. Only while the partition is pushing, and bounded by what its
   * window can take soon (as much again as maxInFlight, at least a read batch), so messages held
   * here stay of the order of those in flight; a partition that is not keeping up reads instead.
   */
  takeTail(g: GroupRuntime, w: PartitionState, messages: DispatchMessage[]): void {
    if (w.reading || w.dropped || w.releasing || g.row.paused || !g.owners[w.partition]) return
    const room = Math.min(MAX_TAIL, Math.max(READ_BATCH, 2 * g.row.maxInFlight))
    if (w.buffer.length + messages.length > room) return
    const next = nextToRead(w)
    if (messages[0]!.offset !== next || next < w.endHint) return
    for (const m of messages) w.buffer.push(m)
  }

  private async readBatch(g: GroupRuntime, w: PartitionState, from: number): Promise<void> {
    w.reading = true
    const hint = w.endHint
    let rows: DispatchMessage[]
    try {
      rows = await readForDispatch(this.deps.db.pool, g.topic.id, w.partition, from, READ_BATCH)
    } catch (err) {
      this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reading messages failed; retrying in 1 s')
      this.deps.timers.setTimeout(() => this.deps.onReadable(g, w), 1000)
      return
    } finally {
      w.reading = false
    }
    // A partition dropped meanwhile (moved, seeked: a new state replaced it) keeps nothing.
    if (w.dropped) return
    // Caught up: wait for produce to say more, unless it already did while this read ran.
    if (rows.length === 0 && w.endHint === hint) w.endHint = from
    let expected = from
    for (const row of rows) {
      if (row.offset > expected) w.gaps.push([expected, row.offset])
      expected = row.offset + 1
    }
    for (const row of rows) w.buffer.push(row)
    this.deps.onReadable(g, w)
  }
}

/** The offset after what the partition's buffer holds (its read position when empty): where reading goes on. */
function nextToRead(w: PartitionState): number {
  const last = w.buffer[w.buffer.length - 1]
  return last === undefined ? w.readPos : Math.max(w.readPos, last.offset + 1)
}

/**
 * How a partition's buffer gets its messages, in offset order: read from the log in batches from
 * the next offset to take (`read`), or, for what this process's own produce has just committed,
 * handed over directly (`takeTail`), which saves reading back what was just written. Offsets are
 * dense, so a hole in what a read returns is retention at work: recorded in `gaps`, which count as
 * completed (the committed offset may pass them).
 *
 * The reads asked for in one turn of the event loop go out as one statement (at most MAX_READS
 * partitions each): another process's produce call tells this one of appends to several of its
 * partitions at once (one NOTIFY), and a statement per partition made these reads the largest share
 * of a second process's extra statements (figures: docs/performance.md#several-processes).
 */
import type { DispatchMessage } from '../core/dispatch-message.ts'
import { readForDispatch, type ReadFrom } from '../store/consumption.ts'
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
/** Partitions read in one statement at most (READ_BATCH rows each): more go in further statements. */
const MAX_READS = 16

/** A place in the log (topic, partition, offset) and the partitions of groups that read from it. */
interface Place {
  from: ReadFrom
  readers: QueuedRead[]
}

interface QueuedRead {
  g: GroupRuntime
  w: PartitionState
  from: number
  /** The partition's end hint when the read was asked for: still the same after an empty read means caught up. */
  hint: number
}

export interface PartitionReaderDeps {
  db: Database
  timers: Timers
  log: { error(obj: object, msg: string): void }
  /** The buffer has new messages (or a read failed and it is time to try again): push what can go. */
  onReadable(g: GroupRuntime, w: PartitionState): void
}

export class PartitionReader {
  private queued: QueuedRead[] = []
  private scheduled = false

  constructor(private readonly deps: PartitionReaderDeps) {}

  /**
   * Reads the next batch into the buffer, after what it holds, unless a read is queued or under way
   * or nothing more is known to be there. Called when the buffer runs empty, and ahead of that, when
   * it runs low (see READ_AHEAD), so a partition keeping its window full does not stop to read. The
   * read goes out at the end of this turn, with every other read asked for in it.
   */
  read(g: GroupRuntime, w: PartitionState): void {
    const from = w.nextToRead()
    if (w.reading || from >= w.endHint) return
    // Reading from here: takeTail leaves the buffer alone until the rows are in.
    w.beginRead()
    this.queued.push({ g, w, from, hint: w.endHint })
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(() => this.flush())
  }

  /**
   * Appends freshly produced messages to the partition's buffer when they follow on from it
   * exactly. Otherwise (a read under way, or messages before them not read yet) the log has them
   * and they are read as usual. Only while the partition is pushing, and bounded by what its
   * window can take soon (as much again as maxInFlight, at least a read batch), so messages held
   * here stay of the order of those in flight; a partition that is not keeping up reads instead.
   */
  takeTail(g: GroupRuntime, w: PartitionState, messages: DispatchMessage[]): void {
    if (w.reading || w.dropped || w.releasing || g.row.paused || !g.consumerOf[w.partition]) return
    const room = Math.min(MAX_TAIL, Math.max(READ_BATCH, 2 * g.row.maxInFlight))
    if (w.buffer.length + messages.length > room) return
    const next = w.nextToRead()
    if (messages[0]!.offset !== next || next < w.endHint) return
    w.appendTail(messages)
  }

  /** Sends the reads queued this turn: each place read once, at most MAX_READS places a statement. */
  private flush(): void {
    this.scheduled = false
    const queued = this.queued
    this.queued = []
    // Groups of one topic at the same place read it once and share the rows (messages are not changed once read).
    const places = new Map<string, Place>()
    for (const r of queued) {
      // Dropped while it waited (moved, seeked: a new state replaced it): nothing to read.
      if (r.w.dropped) {
        r.w.readFailed()
        continue
      }
      const key = `${r.g.topic.id}:${r.w.partition}:${r.from}`
      let place = places.get(key)
      if (!place) places.set(key, (place = { from: { topicId: r.g.topic.id, partition: r.w.partition, fromOffset: r.from }, readers: [] }))
      place.readers.push(r)
    }
    const all = [...places.values()]
    for (let i = 0; i < all.length; i += MAX_READS) void this.readBatch(all.slice(i, i + MAX_READS))
  }

  private async readBatch(places: Place[]): Promise<void> {
    let rows: DispatchMessage[][]
    try {
      rows = await readForDispatch(
        this.deps.db.pool,
        places.map((p) => p.from),
        READ_BATCH,
      )
    } catch (err) {
      for (const { readers } of places) {
        for (const { g, w } of readers) {
          w.readFailed()
          if (w.dropped) continue
          this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'reading messages failed; retrying in 1 s')
          this.deps.timers.setTimeout(() => this.deps.onReadable(g, w), 1000)
        }
      }
      return
    }
    for (let k = 0; k < places.length; k++) for (const r of places[k]!.readers) this.took(r, rows[k]!)
  }

  /**
   * The rows of one partition's read, into its buffer. Its reading flag is cleared here, just
   * before, not for the whole statement at once: pushing one partition's rows can reach another's
   * fill, which must not read again what this statement is bringing it.
   */
  private took({ g, w, from, hint }: QueuedRead, rows: DispatchMessage[]): void {
    // Caught up (empty, and produce said nothing more meanwhile): the end moves back to `from`.
    w.tookRows(from, hint, rows)
    if (w.dropped) return
    this.deps.onReadable(g, w)
  }
}

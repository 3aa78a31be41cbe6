/**
 * Where a partition stands in its log, the half of the partition object (partition.ts) that its
 * messages do not change: what is read and not taken yet (the buffer), the offsets completed
 * (committed, and above it), retention's gaps, and the push reservation. The reader
 * (partition-reader.ts) and the progress writer (progress.ts) change it through these methods only.
 */
import type { PartitionProgress } from '../store/consumption.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'

/** Thrown for a move the partition's rules do not allow: a bug, never a consumer's doing. */
export class IllegalMove extends Error {
  override name = 'IllegalMove'
}

export function illegal(what: string): never {
  throw new IllegalMove(what)
}

export class PartitionLog {
  private _committed: number
  private readonly _completed: Set<number>
  private _readPos: number
  private _endHint: number
  private _buffer: DispatchMessage[] = []
  private _reading = false
  private _gaps: [number, number][] = []
  private _reservedTo: number
  private _reserving = false
  /** Messages that appends under way may reserve (their statements not returned yet). */
  private _appendClaims = 0
  /** Offsets from the read position up to this one were reserved by an append and are not taken yet. */
  private _appendReservedTo = 0
  private appendsWaited: (() => void)[] = []
  private _dropped = false
  /** When the partition was last seeked: older delivery ids no longer count. */
  readonly seekAtMs: number

  constructor(
    readonly partition: number,
    progress: PartitionProgress,
    endHint: number,
  ) {
    this._committed = progress.committed
    this._completed = progress.completed
    this._readPos = progress.committed
    this._endHint = endHint
    this._reservedTo = progress.pushed
    this.seekAtMs = progress.seekedAtMs
  }

  get committed(): number {
    return this._committed
  }
  /** Offsets above the committed one that are completed. */
  get completed(): ReadonlySet<number> {
    return this._completed
  }
  /** Next offset to take from the log. */
  get readPos(): number {
    return this._readPos
  }
  /** The log's end as last heard (produce notifications); reading stops there. */
  get endHint(): number {
    return this._endHint
  }
  get buffer(): readonly DispatchMessage[] {
    return this._buffer
  }
  get reading(): boolean {
    return this._reading
  }
  /** Ranges [from, to) of offsets not in the log any more (retention deleted them): they count as completed. */
  get gaps(): readonly (readonly [number, number])[] {
    return this._gaps
  }
  /** First pushes of offsets below this are recorded as possibly made (group_offsets.pushed_offset). */
  get reservedTo(): number {
    return this._reservedTo
  }
  /** A reservation is being written; messages in state `reserving` wait for it. */
  get reserving(): boolean {
    return this._reserving
  }
  /** Messages that appends under way may reserve here (their statements have not returned). */
  get appendClaims(): number {
    return this._appendClaims
  }
  /**
   * First pushes that appends under way reserve in their own statements (reservations.ts appendRoom),
   * and those they reserved that are not taken yet: their room in the consumer's window is spoken for.
   */
  get reservingByAppend(): number {
    return this._appendClaims + Math.max(0, this._appendReservedTo - this._readPos)
  }
  /** No longer pushed here (moved, seeked, its group changed): whatever still refers to it is void. */
  get dropped(): boolean {
    return this._dropped
  }

  /** The first offset from the committed one on that is neither completed nor in a retention gap. */
  nextIncomplete(): number {
    let c = this._committed
    for (;;) {
      const gap = this._gaps.find(([from, to]) => c >= from && c < to)
      if (gap) c = gap[1]
      else if (this._completed.has(c)) c++
      else return c
    }
  }

  /** The offset after what the buffer holds (the read position when empty): where reading goes on. */
  nextToRead(): number {
    const last = this._buffer[this._buffer.length - 1]
    return last === undefined ? this._readPos : Math.max(this._readPos, last.offset + 1)
  }

  // ---- the log (partition-reader.ts, the dispatcher) ----

  /** Produce says the log reaches `endOffset`. */
  heard(endOffset: number): void {
    if (endOffset > this._endHint) this._endHint = endOffset
  }

  /** A read from nextToRead() is queued (one at a time). */
  beginRead(): void {
    if (this._reading) illegal(`partition ${this.partition}: a second read while one is under way`)
    this._reading = true
  }

  /** The read failed (or its partition was dropped meanwhile): another may start. */
  readFailed(): void {
    this._reading = false
  }

  /**
   * The rows of a read from `from`, into the buffer; holes in them are retention's (they count as
   * completed). `hint`: the end heard when it was asked for; an empty read then means caught up.
   */
  tookRows(from: number, hint: number, rows: readonly DispatchMessage[]): void {
    this._reading = false
    if (this._dropped) return
    if (rows.length === 0 && this._endHint === hint) this._endHint = from
    let expected = from
    for (const row of rows) {
      if (row.offset > expected) this._gaps.push([expected, row.offset])
      expected = row.offset + 1
    }
    for (const row of rows) this._buffer.push(row)
  }

  /** Messages produce has just committed, appended as they follow the buffer exactly (the reader checked). */
  appendTail(messages: readonly DispatchMessage[]): void {
    if (this._reading || messages[0]?.offset !== this.nextToRead()) illegal(`partition ${this.partition}: a tail that does not follow on`)
    for (const m of messages) this._buffer.push(m)
  }

  /**
   * Takes the buffer's first message: undefined when it is one to skip (read twice, or completed
   * already); the read position moves past it either way.
   */
  take(): DispatchMessage | undefined {
    const msg = this._buffer.shift()
    if (!msg || msg.offset < this._readPos) return undefined
    this._readPos = msg.offset + 1
    if (msg.offset < this._committed || this._completed.has(msg.offset)) return undefined
    return msg
  }

  // ---- reservations and progress (push-flow.ts, progress.ts) ----

  /** A reservation is being written (one at a time). */
  beginReservation(): void {
    if (this._reserving) illegal(`partition ${this.partition}: a second reservation while one is written`)
    this._reserving = true
  }

  endReservation(): void {
    this._reserving = false
  }

  /**
   * First pushes from `to` on were never made and cannot be for now (src/dispatch/stalled-reservations.ts):
   * the reservation moves back there. Only by the holder of the reservation under way, with no
   * append reserving here: a reservation landing after the give-back's statement would be undone by it.
   */
  lowerReservation(to: number): void {
    if (!this._reserving || this._appendClaims > 0 || to > this._reservedTo || to < this._committed)
      illegal(`partition ${this.partition}: the reservation lowered to ${to} from ${this._reservedTo} outside a give-back`)
    this._reservedTo = to
  }

  /** An append is about to reserve the first pushes of its `count` messages here. */
  beginAppendReservation(count: number): void {
    this._appendClaims += count
  }

  /**
   * That append is done: its reservation ends at `reservedTo`, or was not written (null). Written,
   * its messages hold their room until they are taken from the buffer, or appendHandedOver.
   */
  endAppendReservation(count: number, reservedTo: number | null): void {
    this._appendClaims -= count
    if (reservedTo !== null) {
      this.advance(null, reservedTo)
      if (reservedTo > this._appendReservedTo) this._appendReservedTo = reservedTo
    }
    if (this._appendClaims > 0 || this.appendsWaited.length === 0) return
    const waiting = this.appendsWaited
    this.appendsWaited = []
    for (const done of waiting) done()
  }

  /** Produce has handed the appended messages over: those not taken by now are read as any others, holding no room. */
  appendHandedOver(): void {
    this._appendReservedTo = 0
  }

  /** Resolves once no append under way reserves here: a handover gives back what they reserved, so it waits for them. */
  appendsReserved(): Promise<void> {
    if (this._appendClaims === 0) return Promise.resolve()
    return new Promise((resolve) => this.appendsWaited.push(resolve))
  }

  /** Marks an offset completed (before its write): false when it is already. */
  markCompleted(offset: number): boolean {
    if (offset < this._committed || this._completed.has(offset)) return false
    this._completed.add(offset)
    return true
  }

  /** Its write failed or was refused: not completed after all. */
  unmarkCompleted(offset: number): void {
    this._completed.delete(offset)
  }

  /** The committed offset moved to `to` (durable); the reservation to `pushedTo`, if given. */
  advance(to: number | null, pushedTo: number | null): void {
    if (to !== null && to > this._committed) {
      // Whichever is shorter: the offsets passed, or the set (it can hold offsets far ahead).
      if (to - this._committed <= this._completed.size) for (let c = this._committed; c < to; c++) this._completed.delete(c)
      else for (const c of this._completed) if (c < to) this._completed.delete(c)
      this._committed = to
      this._gaps = this._gaps.filter(([, end]) => end > to)
    }
    if (pushedTo !== null && pushedTo > this._reservedTo) this._reservedTo = pushedTo
  }

  /** Dropped (see Partition.drop): nothing read is kept, and a read under way brings nothing in. */
  protected dropLog(): void {
    this._dropped = true
    this._buffer = []
  }
}

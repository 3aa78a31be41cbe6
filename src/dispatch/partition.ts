/**
 * One (group, partition) this broker process pushes: the messages outstanding with their
 * attempts, and (its base class, partition-log.ts) where it stands in the log: read, completed,
 * reserved. Only its own methods change it (its fields are read-only outside, by type), and each
 * move of a message is checked against MOVES, which is this table (test/dispatch/partition.test.ts
 * holds the two together):
 *
 *   from         may move to
 *   parked       parked ready delayed reserving in_flight retry_wait completing
 *   ready        parked ready reserving in_flight completing
 *   delayed      parked ready reserving in_flight completing
 *   reserving    parked ready reserving in_flight completing
 *   retry_wait   parked ready reserving in_flight completing
 *   in_flight    nacked retry_wait completing
 *   nacked       retry_wait completing
 *   completing   retry_wait completing gone
 *
 * A message is admitted `parked` and leaves `completing` (forget → gone); dropping the partition
 * ends every message whatever its state. `in_flight` is entered only by begin (an attempt starts)
 * or adopt (the attempt the previous owner handed over in flight becomes this one's) and is the
 * only state with a current attempt; `nacked` only by nackDuringPush (nacked while its
 * push was under way: the answer says what follows); move() refuses both. An attempt (Attempt
 * below) is settled once: by its answer, its ack deadline, an ack, a nack, or an undo when its row
 * could not be written; leaving in_flight before that, or a second begin, throws. A refused move
 * throws IllegalMove: a bug, which the push flow logs (PushFlow.safely) instead of crashing.
 */
import type { PartitionProgress } from '../store/consumption.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import type { HandedOver } from '../store/deliveries.ts'
import { KeyOrder } from './key-order.ts'
import { illegal, PartitionLog } from './partition-log.ts'
import type { TrackerEntry } from './tracker.ts'
import type { Wait } from './waits.ts'

export type State = 'parked' | 'ready' | 'delayed' | 'reserving' | 'retry_wait' | 'in_flight' | 'nacked' | 'completing'
type Move = State | 'gone'

export { IllegalMove } from './partition-log.ts'

const START: readonly Move[] = ['parked', 'ready', 'reserving', 'in_flight', 'completing']
/** The legal moves: the table at the top of this file. */
export const MOVES: Readonly<Record<State, readonly Move[]>> = {
  parked: ['parked', 'ready', 'delayed', 'reserving', 'in_flight', 'retry_wait', 'completing'],
  ready: START,
  delayed: START,
  reserving: START,
  retry_wait: START,
  in_flight: ['nacked', 'retry_wait', 'completing'],
  nacked: ['retry_wait', 'completing'],
  completing: ['retry_wait', 'completing', 'gone'],
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] }

/** A nack that came while its push was under way, acted on when the answer comes. */
export interface PendingNack {
  delayMs: number | undefined
  deadLetter: boolean
}

/**
 * One push attempt of a message: its delivery id and number, and where it stands. Its fields are
 * changed by the Partition only (read-only here by type).
 */
export class Attempt {
  /** Sent (or gathering in a batch) and not answered yet. */
  readonly pushing: boolean = false
  /**
   * Its push was given a connection (or its lease a caller, or it was handed over from a push made
   * before): it may have reached the consumer, so it counts. Until then it is in the partition's
   * `unsent` and, if this ownership ends first, it was never an attempt (see firstUnpushed).
   */
  readonly sent: boolean = false
  /** Its row has no final outcome yet: the message's completion (or abandonment) gives it one. */
  readonly open: boolean = true
  /**
   * Its ack deadline on the schedule. None in auto mode when the push's own timeout comes first
   * (the answer settles the attempt before any deadline could); an extend makes one then.
   */
  readonly deadline: TrackerEntry | undefined = undefined
  /** Nacked while its push was under way: what the nack asked for. */
  readonly nack: PendingNack | undefined = undefined
  constructor(
    readonly id: string,
    readonly number: number,
  ) {}
}

/**
 * An admitted message, made with every field set (`undefined` where there is nothing yet): one is
 * made per message and lives until it completes, and a field added later gives the object a new
 * shape and a separate property store, an allocation per message.
 */
export interface Outstanding {
  readonly msg: DispatchMessage
  /** Attempts made, those before a restart included. */
  readonly attempts: number
  readonly state: State
  /** The attempt in flight, until it is settled (answered in auto mode, acked, nacked, failed, timed out). */
  readonly current: Attempt | undefined
  /** Attempts made here, in order: a late ack of any of them completes the message. */
  readonly tries: readonly Attempt[]
  /** What the message waits for instead (its delay, a retry's backoff, dead-lettering again), if anything. */
  readonly wait: Wait | undefined
  readonly lastError: string | undefined
  /** The consumer the latest attempt went to (whose push window a passed ack deadline shrinks). */
  readonly pushedTo: string | undefined
  /** The group's filter was checked (and matched) for its first push. */
  readonly matched: boolean
}

/** The empty list every message starts with: frozen, so a write meant for a message's own list fails loudly. */
const NONE = Object.freeze([]) as unknown as Attempt[]

export class Partition extends PartitionLog {
  private readonly _outstanding = new Map<number, Outstanding>()
  private _delayed = 0
  /** Messages in state `completing`: answered or acked, their completion being written. */
  private _completing = 0
  /** Messages in state `reserving` (a pull group's reservations are bounded by its callers' room). */
  private _awaitingReservation = 0
  private _ready: Outstanding[] = []
  private _releasing = false
  private onIdle: (() => void) | undefined = undefined
  private readonly keys = new KeyOrder()
  private readonly _unsent = new Set<string>()
  /** Pushes sent (or gathering in a batch) and not answered, of any attempt. */
  private pushes = 0

  constructor(
    partition: number,
    progress: PartitionProgress,
    /** Attempts made before this ownership, by offset (consumed as the messages are admitted). */
    private readonly priorAttempts: Map<number, number>,
    endHint: number,
    /** The owner epoch this process holds (group_offsets.owner_epoch): every write names it. */
    readonly ownerEpoch: number,
    /** Pushes the previous owner handed over in flight (or nacked since), by offset: no push again before their deadlines. */
    private readonly handedOver: Map<number, HandedOver> = new Map(),
    /**
     * Offsets of priorAttempts counted by the reservation alone (no attempt row): their count lasts
     * only while the reservation covers them. Absent: any prior count may be (firstUnpushed).
     */
    private readonly reservedOnly?: Set<number>,
  ) {
    super(partition, progress, endHint)
  }

  // ---- what it holds (read-only views) ----

  get outstanding(): ReadonlyMap<number, Outstanding> {
    return this._outstanding
  }
  /** Messages in state `ready`, in the order they fell due. */
  get ready(): readonly Outstanding[] {
    return this._ready
  }
  /** Outstanding messages in state `delayed`. */
  get delayed(): number {
    return this._delayed
  }
  /** Being handed to another process: nothing new is pushed, the pushes under way are waited for. */
  get releasing(): boolean {
    return this._releasing
  }
  /**
   * Attempts begun here whose push has not gone out (waiting for their row, for the ownership
   * lease, in a gathering batch or in the HTTP client's queue for a connection): a handover deletes
   * their rows and gives back the reservation of first attempts among them, so the next owner
   * reuses their numbers.
   */
  get unsent(): ReadonlySet<string> {
    return this._unsent
  }
  /** Messages waiting for a reservation to be written (state `reserving`). */
  get awaitingReservation(): number {
    return this._awaitingReservation
  }
  /** Outstanding messages in state `completing`. */
  get completing(): number {
    return this._completing
  }
  /**
   * Messages that count against maxInFlight: outstanding, neither delayed, ready nor completing. A
   * message being completed is no longer with its consumer (answered, acked or dead-lettered): its
   * slot goes to the next message while the completion is written beside the pushes.
   */
  active(): number {
    return this._outstanding.size - this._delayed - this._ready.length - this._completing
  }
  /**
   * Whether the completions not yet written leave the next message its room (hasRoom's 2 x limit)
   * whatever is out: then one more may wait for company before it is written (progress.ts lazyMs).
   */
  completionsMayWait(limit: number): boolean {
    return this._completing <= limit
  }
  /**
   * Whether another message may go out under `limit` (maxInFlight): a slot is free, and with the
   * messages whose completions are being written the partition holds fewer than twice the limit,
   * so a progress writer that falls behind holds it at 2 × maxInFlight, not more.
   */
  hasRoom(limit: number): boolean {
    // The messages an append under way may reserve go out as soon as produce hands them over
    // (once written, they are the next to take: nothing passes them here).
    const active = this.active() + this.appendClaims
    return active < limit && active + this._completing < 2 * limit
  }
  /**
   * Whether a message may be admitted from the buffer (`ready`: whether the first ready one may
   * start). Ordering "partition" (`ordered`) holds one message outstanding of any state, one being
   * completed included (were its completion to fail, it would be pushed again after the next).
   */
  mayGo(limit: number, ordered: boolean, ready = false): boolean {
    if (!ordered) return this.hasRoom(limit)
    return (ready ? this._outstanding.size - this._ready.length - this._delayed : this._outstanding.size) < 1
  }
  /** Whether `a` is still the attempt in flight of `o`, and `o` still outstanding here: nothing settled or replaced it meanwhile. */
  inFlight(o: Outstanding, a: Attempt): boolean {
    return this._outstanding.get(o.msg.offset) === o && o.state === 'in_flight' && o.current === a
  }
  /** Whether `id` was issued here for the message at `offset` (a late ack of any attempt counts). */
  issued(offset: number, id: string): boolean {
    return this._outstanding.get(offset)?.tries.some((a) => a.id === id) ?? false
  }
  /** Whether a push of any attempt is under way. */
  pushing(): boolean {
    return this.pushes > 0
  }
  /**
   * Whether a message here is out with its consumer or being completed (pushed or leased and not
   * yet answered, or answered and its completion not yet written): while none is, the partition's
   * next pushes wait on their reservation alone, so the progress writer does not hold it back.
   */
  engaged(): boolean {
    for (const o of this._outstanding.values()) if (o.state === 'in_flight' || o.state === 'nacked' || o.state === 'completing') return true
    return false
  }
  /** Messages held behind their keys' outstanding ones (ordering "key"). */
  keyQueued(): number {
    return this.keys.queued
  }
  keyBusy(key: string): boolean {
    return this.keys.isBusy(key)
  }
  /** Whether the offset may be skipped by the filter now: none of its attempts was made before. */
  pushedBefore(offset: number): boolean {
    return this.priorAttempts.has(offset)
  }

  /**
   * The lowest offset of the reservation that no first push was made for, by this process or (as
   * far as its counts say) before it: a handover moves the reservation back there
   * (src/store/consumption.ts handBack), so the next owner does not count an attempt for a message
   * reserved here but never pushed, or whose push was begun but never sent (Partition.unsent).
   * Messages counted from before this ownership by the reservation alone (no attempt row) and not
   * pushed here stay below it; those counted by their rows need not (the rows keep the count).
   * `live`: this ownership goes on (src/dispatch/stalled-reservations.ts), so an attempt begun and
   * not sent yet may still go, and counts.
   */
  firstUnpushed(live = false): number {
    // Offsets not taken from the log yet were not pushed here, though an append may have reserved them.
    let from = Math.min(this.reservedTo, this.keys.lowestWaiting(), this.readPos)
    let counted = -1
    for (const o of this._outstanding.values()) {
      // Attempts begun here but never sent are not counted (their rows go with the handover).
      let unsent = 0
      if (!live) for (const a of o.tries) if (this._unsent.has(a.id)) unsent++
      if (o.attempts - unsent === 0) from = Math.min(from, o.msg.offset)
      else if (o.tries.length === unsent && o.msg.offset > counted && this.onReservation(o.msg.offset)) counted = o.msg.offset
    }
    for (const [offset, n] of this.priorAttempts) if (n > 0 && offset > counted && this.onReservation(offset)) counted = offset
    return Math.min(this.reservedTo, Math.max(from, counted + 1))
  }

  /** Whether the count from before this ownership of `offset` may rest on the reservation alone (no row of its attempts). */
  private onReservation(offset: number): boolean {
    return this.reservedOnly === undefined || this.reservedOnly.has(offset)
  }

  // ---- admission (push-flow.ts) ----

  /** Ordering "key": the message goes now (true) or waits behind its key's outstanding message. */
  takeKey(msg: DispatchMessage): boolean {
    return this.keys.take(msg)
  }

  /** Ordering changed to "key": the messages already out hold their keys. */
  holdKeys(): void {
    for (const o of this._outstanding.values()) if (o.msg.key !== null) this.keys.hold(o.msg.key)
  }

  /** Ordering changed from "key": the messages waiting behind their keys, in offset order, to admit. */
  drainKeys(): DispatchMessage[] {
    return this.keys.drain()
  }

  /**
   * Makes a message outstanding, `parked`, with the attempts made before this ownership; `handed`
   * is what the previous owner handed over of its last push in flight, if anything.
   */
  admit(msg: DispatchMessage, matched: boolean): { o: Outstanding; handed: HandedOver | undefined } {
    if (this._outstanding.has(msg.offset)) illegal(`partition ${this.partition}: offset ${msg.offset} admitted twice`)
    const attempts = this.priorAttempts.get(msg.offset) ?? 0
    if (this.priorAttempts.size > 0) this.priorAttempts.delete(msg.offset)
    const handed = this.handedOver.size > 0 ? this.handedOver.get(msg.offset) : undefined
    if (handed !== undefined) this.handedOver.delete(msg.offset)
    const o: Outstanding = {
      msg,
      attempts,
      state: 'parked',
      current: undefined,
      tries: NONE,
      wait: undefined,
      lastError: undefined,
      pushedTo: undefined,
      matched,
    }
    this._outstanding.set(msg.offset, o)
    return { o, handed }
  }

  /**
   * Moves a message to another state, as MOVES allows, keeping the delayed count and the ready queue
   * right. `in_flight` comes with an attempt only (begin), `gone` with forget.
   */
  move(o: Outstanding, to: State): void {
    if (to === 'in_flight' || to === 'nacked') illegal(`offset ${o.msg.offset}: ${to} is entered with an attempt (begin, nackDuringPush)`)
    this.step(o, to)
  }

  private step(o: Outstanding, to: State): void {
    const from = o.state
    if (this._outstanding.get(o.msg.offset) !== o) illegal(`offset ${o.msg.offset}: not outstanding here (${from} → ${to})`)
    if (!MOVES[from].includes(to)) illegal(`offset ${o.msg.offset}: ${from} → ${to}`)
    // Only in_flight has a current attempt: it is settled (or undone) before the message leaves.
    if (o.current) illegal(`offset ${o.msg.offset}: ${from} → ${to} with attempt ${o.current.number} not settled`)
    if (from === 'delayed') this._delayed--
    if (from === 'reserving') this._awaitingReservation--
    if (from === 'completing') this._completing--
    if (from === 'ready') removeAt(this._ready, this._ready.indexOf(o))
    mut(o).state = to
    if (to === 'delayed') this._delayed++
    if (to === 'completing') this._completing++
    if (to === 'reserving') this._awaitingReservation++
    if (to === 'ready') this._ready.push(o)
  }

  /** The message waits on the schedule (`delayed` for its delay, else `retry_wait`): `wait` is its entry. */
  waitFor(o: Outstanding, wait: Wait): void {
    this.step(o, wait.kind === 'delay' ? 'delayed' : 'retry_wait')
    mut(o).wait = wait
  }

  /** Its wait ended (the schedule fired it). */
  waitEnded(o: Outstanding, wait: Wait): void {
    if (o.wait !== wait) illegal(`offset ${o.msg.offset}: a wait that is not its own ended`)
    mut(o).wait = undefined
  }

  /** The group's filter changed: messages not pushed yet are checked again when they start. */
  unmatch(): void {
    for (const o of this._outstanding.values()) if (o.attempts === 0) mut(o).matched = false
  }

  /** The filter was checked (and matched) for its first push. */
  matched(o: Outstanding): void {
    mut(o).matched = true
  }

  noteError(o: Outstanding, error: string): void {
    mut(o).lastError = error
  }

  /** A completed message leaves (completing → gone); in ordering "key" its key's next message is returned, to admit. */
  forget(o: Outstanding, byKey: boolean): DispatchMessage | undefined {
    if (this._outstanding.get(o.msg.offset) !== o) return undefined
    if (!MOVES[o.state].includes('gone')) illegal(`offset ${o.msg.offset}: ${o.state} → gone`)
    this._outstanding.delete(o.msg.offset)
    this._completing--
    // An attempt of a settled message that never went (a retry queued when a late ack completed it)
    // has nothing left to give back: kept here it would grow the set, and each handover's DELETE,
    // for as long as the partition is owned.
    for (const a of o.tries) this._unsent.delete(a.id)
    return byKey && o.msg.key !== null ? this.keys.release(o.msg.key) : undefined
  }

  // ---- attempts ----

  /** Begins the next attempt (→ in_flight): its delivery id `id`, number attempts + 1. */
  begin(o: Outstanding, id: string): Attempt {
    if (o.current) illegal(`offset ${o.msg.offset}: attempt ${o.attempts + 1} begun before ${o.current.number} was settled`)
    this.step(o, 'in_flight')
    const a = new Attempt(id, o.attempts + 1)
    const m = mut(o)
    m.attempts = a.number
    m.current = a
    m.tries = o.tries === NONE ? [a] : [...o.tries, a]
    this._unsent.add(id)
    return a
  }

  /**
   * Takes on the attempt the previous owner handed over in flight (→ in_flight): its push was
   * answered and its ack may still come, so it is this partition's current attempt, as if begun
   * here (its ack, nack, extend and deadline are handled here). Its number is the last one counted;
   * `consumerId`, the consumer it went to (whose window and health a passed deadline counts against).
   */
  adopt(o: Outstanding, id: string, number: number, consumerId: string | null): Attempt {
    if (o.current) illegal(`offset ${o.msg.offset}: attempt ${number} adopted before ${o.current.number} was settled`)
    if (number !== o.attempts) illegal(`offset ${o.msg.offset}: attempt ${number} adopted after ${o.attempts} counted`)
    this.step(o, 'in_flight')
    const a = new Attempt(id, number)
    mut(a).sent = true
    const m = mut(o)
    m.current = a
    m.tries = o.tries === NONE ? [a] : [...o.tries, a]
    if (consumerId !== null) m.pushedTo = consumerId
    return a
  }

  /**
   * Settles the current attempt `a` (its answer, deadline, ack or nack decided it). With `close`
   * its row got its final outcome now (a failure, a timeout, a nack), not the completion's.
   */
  settle(o: Outstanding, a: Attempt, close: boolean): void {
    if (o.current !== a) illegal(`offset ${o.msg.offset}: attempt ${a.number} settled but not current`)
    mut(o).current = undefined
    mut(a).deadline = undefined
    if (close) mut(a).open = false
  }

  /** Its row was never written (a retry whose write failed): the attempt did not happen. */
  undo(o: Outstanding, a: Attempt): void {
    if (o.current !== a || o.tries.at(-1) !== a) illegal(`offset ${o.msg.offset}: attempt ${a.number} undone but not the latest`)
    const m = mut(o)
    m.current = undefined
    m.attempts--
    m.tries = o.tries.slice(0, -1)
    this._unsent.delete(a.id)
    mut(a).open = false
    mut(a).deadline = undefined
  }

  /** The current attempt's ack deadline (made at its start, or by an extend). */
  setDeadline(o: Outstanding, a: Attempt, deadline: TrackerEntry | undefined): void {
    if (o.current !== a) illegal(`offset ${o.msg.offset}: a deadline for attempt ${a.number}, which is not current`)
    mut(a).deadline = deadline
  }

  /** Takes the message off the schedule's books: the current attempt (settled, its row left open) and its wait. */
  unschedule(o: Outstanding): void {
    if (o.current) mut(o.current).deadline = undefined
    const m = mut(o)
    m.current = undefined
    m.wait = undefined
  }

  /** Nacked while its push was under way (in_flight → nacked): the answer decides (see answered). */
  nackDuringPush(o: Outstanding, a: Attempt, nack: PendingNack): void {
    if (!a.pushing) illegal(`offset ${o.msg.offset}: attempt ${a.number} nacked during a push it is not making`)
    this.settle(o, a, true)
    this.step(o, 'nacked')
    mut(a).nack = nack
  }

  /** The attempt's row got its final outcome (or the attempt is handed over with its row as it is). */
  close(a: Attempt): void {
    mut(a).open = false
  }

  /** Its push goes out to `consumerId` (or into a batch for it). */
  sending(o: Outstanding, a: Attempt, consumerId: string): void {
    if (a.pushing) illegal(`offset ${o.msg.offset}: attempt ${a.number} sent twice`)
    mut(a).pushing = true
    mut(o).pushedTo = consumerId
    this.pushes++
  }

  /**
   * Its push was answered, or never went (a batch that gave it up). A partition being handed over
   * is told once its last push under way is answered. Returns the nack that came meanwhile, if any.
   */
  answered(a: Attempt): PendingNack | undefined {
    if (!a.pushing) illegal(`attempt ${a.id} answered but not pushing`)
    mut(a).pushing = false
    this.pushes--
    if (this._releasing && this.onIdle && this.pushes === 0) queueMicrotask(this.onIdle)
    const nack = a.nack
    mut(a).nack = undefined
    return nack
  }

  /**
   * Its push was given a connection (or its lease a caller): from here on it counts, whatever
   * becomes of this ownership.
   */
  went(a: Attempt): void {
    mut(a).sent = true
    this._unsent.delete(a.id)
  }

  /** A retry recorded that will not go: its message was settled meanwhile, and its row counts for nothing more here. */
  recorded(a: Attempt): void {
    this._unsent.delete(a.id)
  }

  // ---- the end of this ownership (dispatcher.ts) ----

  /**
   * Being handed over: nothing new goes out. `onIdle` is told when the last push under way is
   * answered (or the partition dropped); false when none is under way.
   */
  release(onIdle: () => void): boolean {
    this._releasing = true
    if (this.pushes === 0) return false
    this.onIdle = onIdle
    return true
  }

  /** No longer pushed here: its messages, whatever their state, are returned for their attempts to be ended. */
  drop(): Outstanding[] {
    this.dropLog()
    const all = [...this._outstanding.values()]
    this._outstanding.clear()
    this._ready = []
    this._delayed = 0
    this._completing = 0
    this._awaitingReservation = 0
    const idle = this.onIdle
    this.onIdle = undefined
    idle?.()
    return all
  }
}

function mut<T>(x: T): Mutable<T> {
  return x as Mutable<T>
}

/** Removes the element at `i` (nothing when i < 0), keeping the order: splice would allocate the array of what it removed. */
export function removeAt<T>(list: T[], i: number): void {
  if (i < 0) return
  // The head is the usual case (queues are taken in order): shift drops it without copying the rest.
  if (i === 0) {
    list.shift()
    return
  }
  for (let k = i + 1; k < list.length; k++) list[k - 1] = list[k]!
  list.length--
}

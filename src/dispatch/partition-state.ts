/**
 * The dispatcher's in-memory state for one group and its partitions, and the pure functions over it.
 * PostgreSQL holds the truth; this is rebuilt from it at start-up (see dispatcher.ts).
 */
import type { ConsumerRow, GroupRow } from '../store/groups.ts'
import type { TopicRow } from '../store/topics.ts'
import { storableText } from '../store/storable.ts'
import type { AppendEntry } from '../store/messages.ts'
import type { DispatchMessage, PartitionProgress } from '../store/consumption.ts'
import { partitionForKey } from '../partitioner.ts'
import type { RetryPolicy } from './retry-policy.ts'
import type { TrackerEntry } from './tracker.ts'
import type { Wait } from './waits.ts'
import { compileFilter, type MessageFilter } from './filter.ts'
import { KeyOrder } from './key-order.ts'

export type State = 'delayed' | 'ready' | 'parked' | 'reserving' | 'in_flight' | 'retry_wait' | 'completing'

/**
 * An admitted message, made by newOutstanding with every field set (`undefined` where there is
 * nothing yet): one is made per message and lives until the message completes, and a field added
 * later gives the object a new shape and a separate property store, an allocation per message.
 */
export interface Outstanding {
  msg: DispatchMessage
  attempts: number
  state: State
  /** The delivery id of the attempt in flight, until it is settled (acked, nacked, failed, timed out). */
  current: string | undefined
  /**
   * Its ack deadline in the tracker. Not in auto mode when the push's own timeout comes first (the
   * answer settles the attempt before any deadline could); an extend makes one then.
   */
  inFlight: TrackerEntry | undefined
  /** What the message waits for instead (its delay, a retry's backoff, dead-lettering again), if anything. */
  wait: Wait | undefined
  /** Delivery ids issued for it (a late ack of any of them completes it); see addId. */
  ids: string[]
  /**
   * Ids whose attempt row has no final outcome yet: the completion gives them theirs. A list, not
   * a Set: it holds one id or none nearly always, and a message is admitted on every push.
   */
  open: string[]
  lastError: string | undefined
  /** The consumer the latest attempt went to (whose push window a passed ack deadline shrinks). */
  pushedTo: string | undefined
  /** The group's filter was checked (and matched) for its first push. */
  matched: boolean
  /** The delivery id of the push under way (sent, not answered yet), if any. */
  pushing: string | undefined
  /**
   * A nack that came while its push was still under way (a consumer library nacks before it
   * answers): acted on when the answer comes, so a dead letter carries the answer's error.
   */
  nackedPush: { id: string; delayMs: number | undefined; deadLetter: boolean } | undefined
}

export interface PartitionState {
  partition: number
  committed: number
  completed: Set<number>
  /** Next offset to read from the log. */
  readPos: number
  /** The log's end as last heard (produce notifications); reading stops there. */
  endHint: number
  buffer: DispatchMessage[]
  reading: boolean
  outstanding: Map<number, Outstanding>
  /** Attempts made before a restart, by offset. */
  priorAttempts: Map<number, number>
  /** First pushes of offsets below this are recorded as possibly made (group_offsets.pushed_offset). */
  reservedTo: number
  /** A reservation is being written; messages in state `reserving` wait for it. */
  reserving: boolean
  /** When the partition was last seeked: older delivery ids no longer count. */
  seekAtMs: number
  /** Outstanding messages in state `delayed`. */
  delayed: number
  /** Messages in state `ready`, in the order they fell due. */
  ready: Outstanding[]
  /** Ranges [from, to) of offsets not in the log any more (retention deleted them): they count as completed. */
  gaps: [number, number][]
  /** The partition's owner epoch this process holds (group_offsets.owner_epoch): every write names it. */
  ownerEpoch: number
  /** Being handed to another process: nothing new is pushed, the pushes under way are waited for. */
  releasing: boolean
  /** Told when the last push under way of a releasing partition ends. */
  onIdle: (() => void) | undefined
  /** No longer pushed here (moved, seeked, its group changed): whatever still refers to it is void. */
  dropped: boolean
  /** Ordering "key": which keys have a message outstanding, and their later messages waiting. */
  keys: KeyOrder
  /**
   * Retries whose attempt row is being written or was written, and whose push has not gone out:
   * if the partition is handed over first, they never will, and their rows must not count.
   */
  unsent: Set<string>
  /** Ack deadlines of pushes the previous owner handed over in flight, by offset: no push again before them. */
  heldUntil: Map<number, number>
}

export interface GroupRuntime {
  row: GroupRow
  topic: TopicRow
  consumers: ConsumerRow[]
  owners: (ConsumerRow | null)[]
  /** The partitions this process owns (see src/cluster/ownership.ts), by number. */
  parts: Map<number, PartitionState>
  policy: RetryPolicy
  /** The group's filter, compiled; undefined: every message is pushed. */
  filter: MessageFilter | undefined
  dropped: boolean
}

/** A group as loaded, with no consumers and no partition owned yet. */
export function newGroupRuntime(row: GroupRow, topic: TopicRow): GroupRuntime {
  return { row, topic, consumers: [], owners: [], parts: new Map(), policy: policyOf(row), filter: filterOf(row), dropped: false }
}

/** A message as admitted: not pushed yet (`attempts` made before a restart count), nothing scheduled. */
export function newOutstanding(msg: DispatchMessage, attempts: number, matched: boolean): Outstanding {
  return {
    msg,
    attempts,
    state: 'parked',
    current: undefined,
    inFlight: undefined,
    wait: undefined,
    ids: EMPTY,
    open: EMPTY,
    lastError: undefined,
    pushedTo: undefined,
    matched,
    pushing: undefined,
    nackedPush: undefined,
  }
}

/** A partition as claimed: where the group stands on it (PostgreSQL's), nothing read or pushed yet. */
export function newPartitionState(
  partition: number,
  progress: PartitionProgress,
  priorAttempts: Map<number, number>,
  endHint: number,
  ownerEpoch: number,
): PartitionState {
  return {
    partition,
    committed: progress.committed,
    completed: progress.completed,
    readPos: progress.committed,
    endHint,
    buffer: [],
    reading: false,
    outstanding: new Map(),
    priorAttempts,
    reservedTo: progress.pushed,
    reserving: false,
    seekAtMs: progress.seekedAtMs,
    delayed: 0,
    ready: [],
    gaps: [],
    ownerEpoch,
    releasing: false,
    onIdle: undefined,
    dropped: false,
    keys: new KeyOrder(),
    unsent: new Set(),
    heldUntil: new Map(),
  }
}

/**
 * The lowest offset of the partition's push reservation that no first push was made for, by this
 * process or (as far as its counts say) before it: a handover moves the reservation back there
 * (src/store/consumption.ts handBack), so the next owner does not count an attempt for a message
 * reserved here but never pushed. Messages counted from before this ownership and not pushed here
 * stay below it (their count may rest on the reservation alone).
 */
export function firstUnpushed(w: PartitionState): number {
  let from = Math.min(w.reservedTo, w.keys.lowestWaiting())
  let counted = -1
  for (const o of w.outstanding.values()) {
    if (o.attempts === 0) from = Math.min(from, o.msg.offset)
    else if (o.ids.length === 0 && o.msg.offset > counted) counted = o.msg.offset
  }
  for (const [offset, n] of w.priorAttempts) if (n > 0 && offset > counted) counted = offset
  return Math.min(w.reservedTo, Math.max(from, counted + 1))
}

export interface CompletionRequest {
  g: GroupRuntime
  w: PartitionState
  offset: number
  /** filtered: the group's filter did not match it; completed without a push */
  outcome: 'acked' | 'dead' | 'filtered'
  deadLetter?: AppendEntry
}

/** `moved`: the partition is not this process's any more (handed over, or its epoch moved on): ask again. */
export type CompletionStatus = 'acked' | 'dead' | 'filtered' | 'already_completed' | 'unknown' | 'moved'

/** The first offset from the committed one on that is neither completed nor in a retention gap. */
export function nextIncomplete(w: PartitionState): number {
  let c = w.committed
  for (;;) {
    const gap = w.gaps.find(([from, to]) => c >= from && c < to)
    if (gap) c = gap[1]
    else if (w.completed.has(c)) c++
    else return c
  }
}

/** Moves a message to another state, keeping the partition's delayed count and ready queue right. */
export function setState(w: PartitionState, o: Outstanding, state: State): void {
  if (o.state === 'delayed') w.delayed--
  if (o.state === 'ready') removeAt(w.ready, w.ready.indexOf(o))
  o.state = state
  if (state === 'delayed') w.delayed++
  if (state === 'ready') w.ready.push(o)
}

/** Messages of a partition that count against maxInFlight: outstanding, neither delayed nor ready. */
export function active(w: PartitionState): number {
  return w.outstanding.size - w.delayed - w.ready.length
}

/** The group's filter, compiled (validated when it was set). */
export function filterOf(row: GroupRow): MessageFilter | undefined {
  return row.filter === null ? undefined : compileFilter(JSON.parse(row.filter))
}

export function policyOf(row: GroupRow): RetryPolicy {
  return {
    initialDelayMs: row.retryInitialDelayMs,
    multiplier: row.retryMultiplier,
    maxDelayMs: row.retryMaxDelayMs,
    jitter: row.retryJitter,
  }
}

/** The dead letter: same key, value and headers, plus headers naming where it came from. */
export function deadLetterEntry(g: GroupRuntime, w: PartitionState, o: Outstanding, dlq: TopicRow, error: string): AppendEntry {
  const headers = {
    ...(JSON.parse(o.msg.headers) as Record<string, string>),
    'hookq-dlq-topic': g.topic.name,
    'hookq-dlq-partition': String(w.partition),
    'hookq-dlq-offset': String(o.msg.offset),
    'hookq-dlq-group': g.row.name,
    'hookq-dlq-attempts': String(o.attempts),
    'hookq-dlq-error': storableText(error) ?? '',
  }
  const partition = o.msg.key !== null ? partitionForKey(o.msg.key, dlq.partitions) : w.partition % dlq.partitions
  return {
    topicId: dlq.id,
    partition,
    key: o.msg.key,
    value: o.msg.value,
    headers: JSON.stringify(headers),
    delayMs: 0,
    idempotencyKey: null,
    // The dead letter stays in the message's trace.
    traceId: o.msg.traceId,
    traceparent: o.msg.traceparent,
    tracestate: o.msg.tracestate,
  }
}

/**
 * Records a new attempt's delivery id, issued and open. The lists start empty and shared (EMPTY)
 * and are made with their first id: a `[]` grown by push gets room for 17 ids, 150 bytes per list
 * per message that nearly always holds one.
 */
export function addId(o: Outstanding, id: string): void {
  if (o.ids === EMPTY) o.ids = [id]
  else o.ids.push(id)
  if (o.open === EMPTY) o.open = [id]
  else o.open.push(id)
}

/** The empty list every Outstanding starts with: frozen, so a write meant for a message's own list fails loudly. */
export const EMPTY = Object.freeze([]) as unknown as string[]

/** Takes `id` out of a message's open attempts (see Outstanding.open), if it is there. */
export function closeAttempt(o: Outstanding, id: string): void {
  removeAt(o.open, o.open.indexOf(id))
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

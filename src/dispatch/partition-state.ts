/**
 * A group as the dispatcher runs it (its row, consumers, the partitions it owns here) and the pure
 * rules over it. The partitions themselves are src/dispatch/partition.ts.
 * PostgreSQL holds the truth; this is rebuilt from it at start-up (see dispatcher.ts).
 */
import type { ConsumerRow, GroupRow } from '../store/groups.ts'
import type { TopicRow } from '../store/topics.ts'
import { storableText } from '../store/storable.ts'
import type { AppendEntry } from '../store/messages.ts'
import type { PartitionProgress } from '../store/consumption.ts'
import type { HandedOver } from '../store/deliveries.ts'
import { partitionForKey } from '../core/partitioner.ts'
import type { RetryPolicy } from '../core/retry-policy.ts'
import { compileFilter, type MessageFilter } from '../core/filter.ts'
import { Partition, type Outstanding } from './partition.ts'

export { removeAt, type Outstanding, type State } from './partition.ts'
/** The partition's state: the Partition object (the name the older modules and tests use). */
export type PartitionState = Partition

export interface GroupRuntime {
  row: GroupRow
  topic: TopicRow
  consumers: ConsumerRow[]
  consumerOf: (ConsumerRow | null)[]
  /** The partitions this process owns (see src/cluster/ownership.ts), by number. */
  parts: Map<number, Partition>
  policy: RetryPolicy
  /** The group's filter, compiled; undefined: every message is pushed. */
  filter: MessageFilter | undefined
  dropped: boolean
}

/** A group as loaded, with no consumers and no partition owned yet. */
export function newGroupRuntime(row: GroupRow, topic: TopicRow): GroupRuntime {
  return { row, topic, consumers: [], consumerOf: [], parts: new Map(), policy: policyOf(row), filter: filterOf(row), dropped: false }
}

/** A partition as claimed: where the group stands on it (PostgreSQL's), nothing read or pushed yet. */
export function newPartitionState(
  partition: number,
  progress: PartitionProgress,
  priorAttempts: Map<number, number>,
  endHint: number,
  ownerEpoch: number,
  handedOver?: Map<number, HandedOver>,
  reservedOnly?: Set<number>,
): Partition {
  return new Partition(partition, progress, priorAttempts, endHint, ownerEpoch, handedOver, reservedOnly)
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

/**
 * The operator's tools on a group: the delivery log (every push attempt, newest first, paged by an
 * opaque keyset cursor) and seek (moving committed offsets, to replay or to skip).
 */
import type { Cluster } from '../cluster/cluster.ts'
import { HookqError } from '../core/errors.ts'
import type { Database } from '../store/db.ts'
import { listAttempts, type AttemptRow, type Outcome } from '../store/deliveries.ts'
import { offsetsAtTime } from '../store/messages.ts'
import { findTopicByName, readEndOffsets } from '../store/topics.ts'
import type { GroupService } from './groups.ts'
import { parseInstant } from './instants.ts'

/** Filters and paging of the delivery log. */
export interface DeliveriesQuery {
  partition?: number
  offset?: number
  outcome?: Outcome
  limit?: number
  cursor?: string
}

/** A seek: exactly one of offset and timestamp; every partition when none is named. */
export interface SeekInput {
  partition?: number
  offset?: number
  timestamp?: string
}

export function deliveryView(r: AttemptRow) {
  return {
    deliveryId: r.deliveryId,
    partition: r.partition,
    offset: r.offset,
    attempt: r.attempt,
    consumerId: r.consumerId,
    startedAt: r.startedAt.toISOString(),
    finishedAt: r.finishedAt?.toISOString() ?? null,
    statusCode: r.statusCode,
    error: r.error,
    outcome: r.outcome,
    durationMs: r.durationMs,
  }
}

/** The cursor is the last row's (startedAt, id), the keyset the listing is ordered by. */
export function encodeCursor(r: { startedAt: Date; deliveryId: string }): string {
  return Buffer.from(`${r.startedAt.toISOString()} ${r.deliveryId}`).toString('base64url')
}

/** The (startedAt, id) a cursor names; anything else is a 400, never a query over garbage. */
export function decodeCursor(cursor: string): { startedAt: Date; id: string } {
  // No NUL in the id (PostgreSQL text cannot hold it) and a time PostgreSQL can store: a forged
  // cursor is a 400, never a query that fails.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: a NUL in the id would fail the query, not match a row
  const m = /^(\S+) ([^\s\u0000]{1,128})$/.exec(Buffer.from(cursor, 'base64url').toString('utf8'))
  const startedAt = m ? parseInstant(m[1]!) : undefined
  // The round trip rejects what Date would accept loosely ("2026", "March 1").
  if (!m || !startedAt || startedAt.toISOString() !== m[1]) {
    throw new HookqError('invalid_cursor', 'cursor is not one this API issued; pass nextCursor from the previous page unchanged')
  }
  return { startedAt, id: m[2]! }
}

export class OperationsService {
  constructor(
    private readonly db: Database,
    private readonly groups: GroupService,
    private readonly cluster: Pick<Cluster, 'seek'>,
    /** This process's attempt log, whose finished rows may still wait (up to 20 ms) for company. */
    private readonly attempts: { flush(): Promise<void> },
    /** How long an attempt is listed (HOOKQ_ATTEMPT_RETENTION_MS). */
    private readonly attemptRetentionMs = Number.POSITIVE_INFINITY,
  ) {}

  /** A page of the group's push attempts, newest first. */
  async deliveries(groupName: string, q: DeliveriesQuery) {
    const group = await this.groups.get(groupName)
    const limit = q.limit ?? 100
    const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor)
    // Rows this process has settled but not yet written go first, so an ack, nack or push answered
    // here is in the listing that follows it. A failed flush keeps its rows and resolves: the
    // listing then shows what is written, as it would without this. Another process's rows still
    // wait for its own flush, at most 20 ms.
    await this.attempts.flush()
    // One row more than asked tells whether another page exists, so the last page says null.
    const rows = await listAttempts(this.db.pool, group.id, {
      partition: q.partition,
      offset: q.offset,
      outcome: q.outcome,
      limit: limit + 1,
      after,
      filedSinceMs: Number.isFinite(this.attemptRetentionMs) ? Date.now() - this.attemptRetentionMs : 0,
    })
    const page = rows.slice(0, limit)
    return { deliveries: page.map(deliveryView), nextCursor: rows.length > limit ? encodeCursor(page.at(-1)!) : null }
  }

  /**
   * Moves the committed offsets of one partition or all. An offset beyond a partition's end is
   * refused (400), not clamped: with no partition named, one too large for any partition refuses
   * the whole seek, so a seek either does what it says everywhere or nothing.
   */
  async seek(groupName: string, input: SeekInput): Promise<{ partitions: { partition: number; committedOffset: number }[] }> {
    if ((input.offset === undefined) === (input.timestamp === undefined)) {
      throw new HookqError('invalid_request', 'give exactly one of offset and timestamp')
    }
    const at = input.timestamp === undefined ? undefined : parseInstant(input.timestamp)
    if (input.timestamp !== undefined && at === undefined) {
      throw new HookqError(
        'invalid_request',
        `timestamp must be an RFC 3339 date-time such as 2026-01-01T00:00:00Z, got ${JSON.stringify(input.timestamp)}`,
      )
    }
    const group = await this.groups.get(groupName)
    const topic = await findTopicByName(this.db.prisma, group.topic)
    if (!topic) throw new HookqError('topic_not_found', `topic ${group.topic} of group ${group.name} does not exist`)
    if (input.partition !== undefined && input.partition >= topic.partitions) {
      throw new HookqError(
        'partition_not_found',
        `topic ${topic.name} has ${topic.partitions} partitions (0 to ${topic.partitions - 1}); no partition ${input.partition}`,
      )
    }
    const ends = new Map((await readEndOffsets(this.db.prisma, topic.id)).map((e) => [e.partition, e.endOffset]))
    const end = (p: number) => ends.get(p) ?? 0
    const partitions = input.partition !== undefined ? [input.partition] : Array.from({ length: topic.partitions }, (_, p) => p)
    const targets = new Map<number, number>()
    if (input.offset !== undefined) {
      const offset = input.offset
      const beyond = partitions.filter((p) => offset > end(p))
      if (beyond.length > 0) {
        throw new HookqError(
          'offset_out_of_range',
          `offset ${offset} is beyond the end of ${beyond.map((p) => `partition ${p} (end offset ${end(p)})`).join(', ')}`,
        )
      }
      for (const p of partitions) targets.set(p, offset)
    } else {
      const firsts = await offsetsAtTime(this.db.pool, topic.id, at!)
      for (const p of partitions) targets.set(p, firsts.get(p) ?? end(p))
    }
    await this.cluster.seek({ name: group.name, id: group.id }, topic.id, targets)
    const committed = await this.groups.ensureOffsets(group, topic.id, topic.partitions)
    return { partitions: [...committed].sort(([a], [b]) => a - b).map(([partition, committedOffset]) => ({ partition, committedOffset })) }
  }
}

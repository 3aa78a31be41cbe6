/**
 * Storage of messages: the append transaction behind group commit, and reads in offset order.
 *
 * Append is raw SQL on a pooled pg client: it is the hot path, and what it needs — locking the
 * partition rows in a fixed order, and inserting thousands of rows from arrays in one statement —
 * is beyond Prisma's query API. Reads go through Prisma.
 */
import type pg from 'pg'
import type { Database } from './db.ts'
import { isDatabaseUnavailable } from './errors.ts'

/** One message to append; `value` and `headers` are JSON text. */
export interface AppendEntry {
  topicId: number
  partition: number
  key: string | null
  value: string
  headers: string
  delayMs: number
  idempotencyKey: string | null
}

/** Where an appended message landed; `duplicate` when its idempotency key was seen before. */
export interface Coordinates {
  partition: number
  offset: number
  duplicate: boolean
}

export interface StoredMessage {
  partition: number
  offset: number
  key: string | null
  value: string
  headers: string
  timestamp: Date
}

// Locks the partition rows in (topic, partition) order — two transactions touching the same
// partitions can then never deadlock — and hands out one dense range of offsets per partition.
// The lock is held until COMMIT, so a partition's transactions commit in offset order and no reader
// ever sees offset n+1 before n.
const ALLOCATE_OFFSETS = `
WITH wanted AS (
  SELECT * FROM unnest($1::int[], $2::int[], $3::int[]) AS w(topic_id, partition, n)
), locked AS (
  SELECT p.topic_id, p.partition FROM topic_partitions p
  JOIN wanted w ON w.topic_id = p.topic_id AND w.partition = p.partition
  ORDER BY p.topic_id, p.partition
  FOR UPDATE OF p
)
UPDATE topic_partitions p SET next_offset = p.next_offset + w.n
FROM locked l JOIN wanted w ON w.topic_id = l.topic_id AND w.partition = l.partition
WHERE p.topic_id = l.topic_id AND p.partition = l.partition
RETURNING p.topic_id, p.partition, p.next_offset - w.n AS first_offset`

// clock_timestamp() is read after the partition locks are held, so produce timestamps never go
// backwards along a partition's offsets (now() would be the earlier transaction start).
const INSERT_MESSAGES = `
WITH ts AS (SELECT clock_timestamp() AS at)
INSERT INTO messages (topic_id, partition, "offset", key, value, headers, produced_at, available_at, idempotency_key)
SELECT u.t, u.p, u.o, u.k, u.v, u.h, ts.at, ts.at + u.d * interval '1 millisecond', u.i
FROM ts, unnest($1::int[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[])
  AS u(t, p, o, k, v, h, d, i)`

const FIND_IDEMPOTENCY_KEYS = `
SELECT m.topic_id, m.idempotency_key, m.partition, m."offset",
       m.produced_at < clock_timestamp() - t.retention_ms * interval '1 millisecond' AS expired
FROM unnest($1::int[], $2::text[]) AS k(topic_id, key)
JOIN messages m ON m.topic_id = k.topic_id AND m.idempotency_key = k.key
JOIN topics t ON t.id = m.topic_id`

// A key whose message outlived the topic's retention no longer deduplicates; free it for reuse.
const RELEASE_IDEMPOTENCY_KEYS = `
UPDATE messages m SET idempotency_key = NULL
FROM unnest($1::int[], $2::text[]) AS k(topic_id, key)
WHERE m.topic_id = k.topic_id AND m.idempotency_key = k.key`

/** Postgres errors after which re-running the whole append is correct and likely to succeed. */
const RETRYABLE = new Set([
  '23505', // unique_violation: a concurrent writer stored the same idempotency key first
  '40P01', // deadlock_detected
  '40001', // serialization_failure
])
const MAX_ATTEMPTS = 4

const idKey = (topicId: number, key: string) => `${topicId}\u0000${key}`
const partKey = (topicId: number, partition: number) => `${topicId}:${partition}`

export class MessageStore {
  constructor(private readonly db: Database) {}

  /**
   * Appends the entries in one transaction, all or nothing, and returns each one's coordinates
   * in input order; null for an entry whose topic no longer exists. Resolves only after COMMIT.
   */
  async append(entries: AppendEntry[]): Promise<(Coordinates | null)[]> {
    for (let attempt = 1; ; attempt++) {
      const client = await this.db.pool.connect()
      let broken = false
      try {
        await client.query('BEGIN')
        const result = await appendInTransaction(client, entries)
        await client.query('COMMIT')
        return result
      } catch (err) {
        await client.query('ROLLBACK').catch(() => { broken = true })
        if (isDatabaseUnavailable(err)) broken = true
        const code = (err as { code?: string }).code
        if (attempt >= MAX_ATTEMPTS || code === undefined || !RETRYABLE.has(code)) throw err
      } finally {
        // A client whose ROLLBACK failed has a dead connection: destroy it rather than reuse it.
        client.release(broken)
      }
    }
  }

  /** Up to `limit` messages of a partition from `fromOffset` on, in offset order. */
  async read(topicId: number, partition: number, fromOffset: number, limit: number): Promise<StoredMessage[]> {
    const rows = await this.db.prisma.message.findMany({
      where: { topicId, partition, offset: { gte: BigInt(fromOffset) } },
      orderBy: { offset: 'asc' },
      take: limit,
      select: { partition: true, offset: true, key: true, value: true, headers: true, producedAt: true },
    })
    return rows.map((r) => ({
      partition: r.partition,
      offset: Number(r.offset),
      key: r.key,
      value: r.value,
      headers: r.headers,
      timestamp: r.producedAt,
    }))
  }
}

async function appendInTransaction(client: pg.PoolClient, entries: AppendEntry[]): Promise<(Coordinates | null)[]> {
  const result: (Coordinates | null)[] = new Array(entries.length).fill(null)
  // Index of the entry that is the original for a duplicate within this batch.
  const duplicateOf = new Map<number, number>()
  const known = await findKnownKeys(client, entries)
  const firstWithKey = new Map<string, number>()
  const fresh: number[] = []
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i]!
    if (e.idempotencyKey !== null) {
      const k = idKey(e.topicId, e.idempotencyKey)
      const stored = known.get(k)
      if (stored) { result[i] = { ...stored, duplicate: true }; continue }
      const first = firstWithKey.get(k)
      if (first !== undefined) { duplicateOf.set(i, first); continue }
      firstWithKey.set(k, i)
    }
    fresh.push(i)
  }

  // Count per partition, then allocate one range of offsets each.
  const counts = new Map<string, { topicId: number; partition: number; n: number; next: number }>()
  for (const i of fresh) {
    const e = entries[i]!
    const k = partKey(e.topicId, e.partition)
    const c = counts.get(k)
    if (c) c.n++
    else counts.set(k, { topicId: e.topicId, partition: e.partition, n: 1, next: -1 })
  }
  if (counts.size > 0) {
    const cs = [...counts.values()]
    const allocated = await client.query<{ topic_id: number; partition: number; first_offset: number }>(
      ALLOCATE_OFFSETS,
      [cs.map((c) => c.topicId), cs.map((c) => c.partition), cs.map((c) => c.n)],
    )
    for (const row of allocated.rows) counts.get(partKey(row.topic_id, row.partition))!.next = row.first_offset
  }

  const cols: [number[], number[], number[], (string | null)[], string[], string[], number[], (string | null)[]] =
    [[], [], [], [], [], [], [], []]
  for (const i of fresh) {
    const e = entries[i]!
    const c = counts.get(partKey(e.topicId, e.partition))!
    if (c.next < 0) continue // the topic was deleted meanwhile: result stays null
    const offset = c.next++
    result[i] = { partition: e.partition, offset, duplicate: false }
    cols[0].push(e.topicId); cols[1].push(e.partition); cols[2].push(offset); cols[3].push(e.key)
    cols[4].push(e.value); cols[5].push(e.headers); cols[6].push(e.delayMs); cols[7].push(e.idempotencyKey)
  }
  if (cols[0].length > 0) await client.query(INSERT_MESSAGES, cols)
  for (const [i, first] of duplicateOf) {
    const original = result[first]
    result[i] = original ? { ...original, duplicate: true } : null
  }
  return result
}

/** Idempotency keys of this batch already stored within retention, with their coordinates. */
async function findKnownKeys(client: pg.PoolClient, entries: AppendEntry[]): Promise<Map<string, Omit<Coordinates, 'duplicate'>>> {
  const known = new Map<string, Omit<Coordinates, 'duplicate'>>()
  const topicIds: number[] = []
  const keys: string[] = []
  for (const e of entries) {
    if (e.idempotencyKey !== null) { topicIds.push(e.topicId); keys.push(e.idempotencyKey) }
  }
  if (keys.length === 0) return known
  const found = await client.query<{ topic_id: number; idempotency_key: string; partition: number; offset: number; expired: boolean }>(
    FIND_IDEMPOTENCY_KEYS, [topicIds, keys])
  const expired = found.rows.filter((r) => r.expired)
  if (expired.length > 0) {
    await client.query(RELEASE_IDEMPOTENCY_KEYS, [expired.map((r) => r.topic_id), expired.map((r) => r.idempotency_key)])
  }
  for (const r of found.rows) {
    if (!r.expired) known.set(idKey(r.topic_id, r.idempotency_key), { partition: r.partition, offset: r.offset })
  }
  return known
}

// Deletes one bounded slice of the expired messages of a topic, so a large backlog is removed in
// short transactions instead of one long one that holds locks and bloats WAL at once.
const DELETE_EXPIRED = `
DELETE FROM messages m USING (
  SELECT topic_id, partition, "offset" FROM messages
  WHERE topic_id = $1 AND produced_at < clock_timestamp() - $2::bigint * interval '1 millisecond'
  LIMIT $3
) doomed
WHERE m.topic_id = doomed.topic_id AND m.partition = doomed.partition AND m."offset" = doomed."offset"`

/** Deletes up to `limit` messages of the topic older than `retentionMs`; returns how many. */
export async function deleteExpired(db: Database, topicId: number, retentionMs: number, limit: number): Promise<number> {
  const res = await db.pool.query(DELETE_EXPIRED, [topicId, retentionMs, limit])
  return res.rowCount ?? 0
}

/**
 * How much disk the tables hookq writes take, and how old the oldest row kept is: read for the
 * /metrics gauges (in the background, src/lag-snapshot.ts) and for a topic's description.
 *
 * Every statement here is cheap whatever the tables hold: sizes come from the catalog
 * (pg_total_relation_size reads file sizes, not rows; a partitioned table is summed over its
 * partitions), dead rows from the statistics collector, and the oldest rows through indexes: a
 * partition's first offset by the primary key (retention deletes from the front, and produce times
 * never go backwards along a partition's offsets), a group's oldest attempt by (group_id, started_at).
 */
import type pg from 'pg'
import type { Queryable } from './db.ts'

/** The tables that grow with traffic (the others grow with topics, groups and consumers). */
export const HOT_TABLES = [
  'messages',
  'idempotency_keys',
  'deliveries',
  'group_offsets',
  'group_completions',
  'consumer_health',
  'produce_outbox',
  'produce_outbox_set_aside',
] as const

export interface TableSize {
  table: string
  /** With indexes and TOAST, over all its partitions. */
  bytes: number
  /** Deleted or updated row versions not yet vacuumed (pg_stat_user_tables.n_dead_tup). */
  deadRows: number
}

export interface TopicStorage {
  topicId: number
  topic: string
  /** Messages kept: per partition, its end offset minus its oldest offset kept. */
  messages: number
  /** Produce time of the oldest message kept, ms since the epoch (null: none kept). */
  oldestMs: number | null
  /** The topic's share of the messages table: its messages times the table's bytes per message kept. */
  approxBytes: number
}

export interface PartitionStorage {
  topicId: number
  partition: number
  /** The oldest offset kept (the end offset when the partition keeps none). */
  startOffset: number
  endOffset: number
  /** Produce time of the message at startOffset, ms since the epoch (null: none kept). */
  oldestMs: number | null
}

export interface StorageStats {
  tables: TableSize[]
  topics: TopicStorage[]
  /** Start of the oldest attempt the attempt log keeps, ms since the epoch (null: none). */
  oldestAttemptMs: number | null
}

// A table and its partitions (pg_partition_tree lists nothing for a table that is not partitioned;
// a partitioned parent's own size is 0).
const TABLE_SIZES = `
SELECT t.name AS table, sum(pg_total_relation_size(r.oid))::float8 AS bytes, coalesce(sum(s.n_dead_tup), 0)::float8 AS dead
FROM unnest($1::text[]) AS t(name)
JOIN pg_class c ON c.oid = to_regclass(t.name)
CROSS JOIN LATERAL (SELECT c.oid UNION SELECT p.relid FROM pg_partition_tree(c.oid) p) r(oid)
LEFT JOIN pg_stat_user_tables s ON s.relid = r.oid
GROUP BY t.name
ORDER BY t.name`

// One index probe per partition of one topic: its first row by the primary key. Per topic, the
// topic id a parameter of an unnamed statement (a custom plan): only that topic's chunks are
// planned, opened and locked, never every topic's at once (src/store/message-chunks.ts).
const PARTITION_STARTS = `
SELECT p.topic_id, p.partition, p.next_offset::float8 AS end_offset, f."offset"::float8 AS start_offset,
       (extract(epoch FROM f.produced_at) * 1000)::float8 AS oldest_ms
FROM topic_partitions p
LEFT JOIN LATERAL (
  SELECT m."offset", m.produced_at FROM messages m
  WHERE m.topic_id = $1 AND m.partition = p.partition ORDER BY m."offset" LIMIT 1
) f ON true
WHERE p.topic_id = $1
ORDER BY p.partition`

// One index probe per group: its oldest attempt by (group_id, started_at).
const OLDEST_ATTEMPT = `
SELECT (extract(epoch FROM min(o.started_at)) * 1000)::float8 AS oldest_ms
FROM consumer_groups g
CROSS JOIN LATERAL (SELECT d.started_at FROM deliveries d WHERE d.group_id = g.id ORDER BY d.started_at LIMIT 1) o`

/**
 * The sizes of the hot tables (those that exist), with their indexes. The sizes lock each partition
 * as they read it; the parents are locked first, so a read never holds one partition while the
 * attempt log's maintenance, holding the parent, waits for it (a deadlock): it waits its turn whole.
 * messages is summed topic by topic (messagesSize), so that no transaction holds every topic's
 * chunks at once.
 */
export async function tableSizes(pool: pg.Pool): Promise<TableSize[]> {
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    let sizes: TableSize[]
    try {
      await client.query("SET LOCAL lock_timeout = '2s'")
      await client.query('LOCK TABLE deliveries IN ACCESS SHARE MODE')
      const { rows } = await client.query<{ table: string; bytes: number; dead: number }>(TABLE_SIZES, [
        HOT_TABLES.filter((t) => t !== 'messages'),
      ])
      await client.query('COMMIT')
      sizes = rows.map((r) => ({ table: r.table, bytes: r.bytes, deadRows: r.dead }))
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {})
      throw err
    }
    sizes.push(await messagesSize(client))
    return sizes.sort((a, b) => (a.table < b.table ? -1 : a.table > b.table ? 1 : 0))
  } finally {
    client.release()
  }
}

// The parts of messages: a tree per topic and the default (src/store/message-chunks.ts).
const MESSAGES_PARTS = `
SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'messages'::regclass ORDER BY c.relname`

/**
 * The size of messages, one part (a topic's tree) per transaction: its parent locked first (ONLY,
 * not its chunks), as a chunk's drop locks it before the chunk, then its chunks as they are read.
 * One round trip each (the simple protocol runs the statements as one string).
 */
async function messagesSize(client: pg.PoolClient): Promise<TableSize> {
  const size: TableSize = { table: 'messages', bytes: 0, deadRows: 0 }
  for (const { name } of (await client.query<{ name: string }>(MESSAGES_PARTS)).rows) {
    const ident = `"${name.replace(/"/g, '""')}"`
    try {
      const results = (await client.query(
        `BEGIN; SET LOCAL lock_timeout = '2s'; LOCK TABLE ONLY ${ident} IN ACCESS SHARE MODE;
         SELECT sum(pg_total_relation_size(r.oid))::float8 AS bytes, coalesce(sum(s.n_dead_tup), 0)::float8 AS dead
         FROM (SELECT '${ident}'::regclass::oid UNION SELECT p.relid FROM pg_partition_tree('${ident}'::regclass) p) r(oid)
         LEFT JOIN pg_stat_user_tables s ON s.relid = r.oid;
         COMMIT`,
      )) as unknown as pg.QueryResult<{ bytes: number | null; dead: number }>[]
      const row = results.find((r) => r.command === 'SELECT')?.rows[0]
      size.bytes += row?.bytes ?? 0
      size.deadRows += row?.dead ?? 0
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {})
      // A topic's tree dropped since it was listed (its topic deleted) has no size left.
      if ((err as { code?: string }).code !== '42P01') throw err
    }
  }
  return size
}

/** Every partition's (or one topic's partitions') oldest offset kept and its produce time: a statement per topic. */
export async function partitionStarts(q: Queryable, topicId: number | null = null): Promise<PartitionStorage[]> {
  const ids =
    topicId !== null
      ? [topicId]
      : (await q.query<{ id: number }>('SELECT DISTINCT topic_id AS id FROM topic_partitions ORDER BY 1')).rows.map((r) => r.id)
  const out: PartitionStorage[] = []
  for (const id of ids) {
    const { rows } = await q.query<{
      topic_id: number
      partition: number
      end_offset: number
      start_offset: number | null
      oldest_ms: number | null
    }>(PARTITION_STARTS, [id])
    for (const r of rows) {
      out.push({
        topicId: r.topic_id,
        partition: r.partition,
        startOffset: r.start_offset ?? r.end_offset,
        endOffset: r.end_offset,
        oldestMs: r.oldest_ms,
      })
    }
  }
  return out
}

/**
 * Sums partitions into the topics `names` names; `messagesBytes` (the messages table's size) is
 * shared by every message kept in `parts`, named or not.
 */
export function topicStorage(parts: PartitionStorage[], names: Map<number, string>, messagesBytes: number): TopicStorage[] {
  const byTopic = new Map<number, TopicStorage>()
  let total = 0
  for (const p of parts) {
    const kept = p.endOffset - p.startOffset
    total += kept
    const name = names.get(p.topicId)
    if (name === undefined) continue
    let t = byTopic.get(p.topicId)
    if (!t) byTopic.set(p.topicId, (t = { topicId: p.topicId, topic: name, messages: 0, oldestMs: null, approxBytes: 0 }))
    t.messages += kept
    if (p.oldestMs !== null && (t.oldestMs === null || p.oldestMs < t.oldestMs)) t.oldestMs = p.oldestMs
  }
  const perMessage = total > 0 ? messagesBytes / total : 0
  for (const t of byTopic.values()) t.approxBytes = Math.round(t.messages * perMessage)
  return [...byTopic.values()]
}

/** Everything the storage gauges show, in four cheap statements. */
export async function readStorageStats(pool: pg.Pool): Promise<StorageStats> {
  const q: Queryable = pool
  const tables = await tableSizes(pool)
  const topics = await q.query<{ id: number; name: string }>('SELECT id, name FROM topics')
  const parts = await partitionStarts(q)
  const oldest = await q.query<{ oldest_ms: number | null }>(OLDEST_ATTEMPT)
  const messagesBytes = tables.find((t) => t.table === 'messages')?.bytes ?? 0
  return {
    tables,
    topics: topicStorage(parts, new Map(topics.rows.map((t) => [t.id, t.name])), messagesBytes),
    oldestAttemptMs: oldest.rows[0]?.oldest_ms ?? null,
  }
}

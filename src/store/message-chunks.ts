/**
 * The messages table's chunks (see the migration 20261206230000_message_chunks): messages is
 * partitioned by range of topic_id, one tree per topic (messages_t<id>, FROM (id) TO (id + 1)),
 * and each tree by range of produced_at into chunks (messages_t<id>_<from>_<to>, bounds in ms
 * since the epoch, 0: from the start) and a default (messages_t<id>_default). Retention drops a
 * chunk whole once its end is older than the topic's retention: no row is deleted, so none waits
 * for vacuum.
 *
 * The topics that existed when messages was split have no tree: their rows, old and new, are in
 * messages_legacy (the table as it was, never copied, attached as the range of every id below a
 * bound the topics' id sequence starts at: legacyBound; not a list of the ids, which pg_class could
 * not hold past some 600-1,000 of them), and maintainLegacy deletes those past the retention row
 * by row as before; messages_legacy is dropped once none of its topics is left and it is empty.
 * Moving such a topic to a tree would change messages_legacy's bound, which takes ACCESS EXCLUSIVE
 * on messages: not done.
 *
 * Spans are the attempt log's (attemptPartitionPlan: a quarter of the retention, 30 s to a day),
 * shifted by a phase of the topic's own, so that topics do not all roll over at the same moment.
 * Chunks cover from the current span to `aheadMs` ahead: made when the topic is created (before it
 * is answered), at start-up, and by every sweep.
 *
 * Rows no chunk covers (the sweep stopped for longer than the chunks ahead last; a test that ages
 * rows) go to the topic's default partition; a topic without a tree (its creation failed to make
 * one) to messages_default. Each maintenance deletes those past the retention and makes the chunks
 * that cover the others, moving them there once: a row is never filed twice.
 *
 * Locking. One transaction per topic and per chunk made, serialized per topic by a
 * transaction-scoped advisory lock (class MAINTENANCE_LOCK, the topic id): several processes
 * sweeping at once wait for each other topic by topic and find nothing left to do. Whether a topic
 * is deleted is read inside that lock, after the tree was listed: a tree is only ever made for a
 * topic whose row was committed, and ids are never reused, so a tree whose topic row is absent is a
 * deleted topic's (a topic created during a sweep is either absent from it altogether or
 * maintained as it is). No maintenance takes a lock on messages itself stronger than SHARE UPDATE
 * EXCLUSIVE (attaching a new tree), which produce and reads of every topic go on under.
 * - A chunk ahead is made by CREATE TABLE then ALTER TABLE tree ATTACH PARTITION, one a
 *   transaction: SHARE UPDATE EXCLUSIVE on the topic's tree, ACCESS EXCLUSIVE on the new chunk and
 *   on the topic's default partition (checked to hold none of the chunk's rows). The default is
 *   locked (SHARE ROW EXCLUSIVE) before anything is read, so no produce commits a row there that
 *   the attach would then refuse. Produce into the topic's chunks goes on; its reads (which scan
 *   the default too) and a produce into the default wait for the commit, a moment (a produce routed
 *   there before the attach fails with 23514 after it, and is run again: withAppendRetries).
 * - Strays are filed (rare) under ACCESS EXCLUSIVE on the topic's tree: the topic's produce and
 *   reads wait for the moment it takes, so that no read sees the rows neither where they were nor
 *   where they went (a read of dispatch that comes back empty against the partition's end offset is
 *   read again as well, src/store/consumption.ts).
 * - A chunk is dropped by DETACH PARTITION then DROP, in a transaction of its own that runs even
 *   when making chunks failed: ACCESS EXCLUSIVE on the topic's tree for a moment, that topic's
 *   produce and reads wait for it, no other topic's. DETACH ... CONCURRENTLY would not need it, but
 *   PostgreSQL refuses it where a default partition exists, and the default is what keeps produce
 *   from failing when no chunk covers a row. A short lock_timeout (100 ms) with a few jittered
 *   tries bounds how long a group commit of the topic can queue behind it.
 * - A deleted topic's chunks are dropped the same way and its default truncated; its empty tree
 *   stays attached (renamed messages_gone_t<id>): detaching it takes ACCESS EXCLUSIVE on
 *   messages, which every produce of every topic waits for, so the trees are detached and
 *   dropped only in batches (removeGoneTrees), under one short-lived lock a batch.
 */
import type pg from 'pg'
import { attemptPartitionPlan } from './attempt-partitions.ts'

/** "hkqC": the advisory lock class of a topic's chunk maintenance (the topic id is the other key). */
const MAINTENANCE_LOCK = 0x686b7143
const CHUNK = /^messages_t(\d+)_(\d+)_(\d+)$/
const TREE = /^messages_t(\d+)$/
const GONE_TREE = /^messages_gone_t\d+$/
const TOP_DEFAULT = 'messages_default'
const tree = (topicId: number) => `messages_t${topicId}`
/** A deleted topic's empty tree, left attached (see dropDeletedTopic). */
const goneTree = (topicId: number) => `messages_gone_t${topicId}`
const topicDefault = (topicId: number) => `messages_t${topicId}_default`
const chunkName = (topicId: number, fromMs: number, toMs: number) => `messages_t${topicId}_${fromMs}_${toMs}`

export interface MessageChunk {
  name: string
  topicId: number
  fromMs: number
  toMs: number
}

export interface ChunkPlan {
  spanMs: number
  aheadMs: number
  /** Where this topic's spans begin, 0 ≤ phaseMs < spanMs. */
  phaseMs: number
}

/** A topic's chunk spans: the attempt log's for its retention, shifted by a phase of its own. */
export function chunkPlan(topicId: number, retentionMs: number, sweepIntervalMs: number): ChunkPlan {
  const { spanMs, aheadMs } = attemptPartitionPlan(retentionMs, sweepIntervalMs)
  // The golden ratio's fraction spreads consecutive ids evenly over the span.
  const phaseMs = Math.floor(((topicId * 0.6180339887498949) % 1) * spanMs)
  return { spanMs, aheadMs, phaseMs }
}

/** The start of the span holding `ms`. */
export const spanStart = (ms: number, plan: ChunkPlan) => Math.floor((ms - plan.phaseMs) / plan.spanMs) * plan.spanMs + plan.phaseMs

/**
 * The chunks to make: each wanted span start's span, minus what existing chunks cover (they may be
 * aligned otherwise: the migration's first chunk, a retention changed since).
 */
export function chunksToCreate(topicId: number, existing: MessageChunk[], spanStarts: Iterable<number>, plan: ChunkPlan): MessageChunk[] {
  const made: MessageChunk[] = []
  const covered = [...existing]
  for (const a of [...new Set(spanStarts)].sort((x, y) => x - y)) {
    const b = a + plan.spanMs
    let from = a
    while (from < b) {
      const covering = covered.find((c) => c.fromMs <= from && from < c.toMs)
      if (covering) {
        from = covering.toMs
        continue
      }
      const to = Math.min(b, ...covered.filter((c) => c.fromMs > from).map((c) => c.fromMs))
      const c = { name: chunkName(topicId, from, to), topicId, fromMs: from, toMs: to }
      made.push(c)
      covered.push(c)
      from = to
    }
  }
  return made
}

export interface TopicChunkResult {
  /** False: another process held this topic's maintenance and `wait` was off; nothing was done. */
  ran: boolean
  created: string[]
  dropped: string[]
  /** Messages of the dropped chunks (and of a deleted topic's tree). */
  droppedRows: number
  /** Rows out of a default partition deleted (past the retention, or of a deleted topic). */
  strayRows: number
  /** Rows out of a default partition filed into the chunks made for them. */
  filedRows: number
  /** Rows of messages_legacy deleted (past the retention, or of a deleted topic). */
  legacyRows: number
}

export interface ChunkMaintenanceOptions {
  /** How often the sweep runs, ms (chunks are made far enough ahead to outlast a few missed sweeps). */
  sweepIntervalMs: number
  /** Wait for another process's maintenance of the topic instead of skipping it. */
  wait?: boolean
  /** How long to wait for a table lock, ms. */
  lockTimeoutMs?: number
  /** How many tries a transaction gets whose table lock timed out (4), after a 20-100 ms jittered pause. */
  lockAttempts?: number
  /** messages_legacy rows deleted per statement (10,000). */
  legacySliceRows?: number
  /** Deleted topics' empty trees removed together once there are this many (16): removeGoneTrees. */
  goneTreesBatch?: number
}

type Client = pg.PoolClient

const children = async (q: Client, parent: string) =>
  (
    await q.query<{ name: string }>(
      `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`,
      [parent],
    )
  ).rows.map((r) => r.name)

/** The chunks of a topic's tree, oldest first. */
async function listChunks(q: Client, topicId: number): Promise<MessageChunk[]> {
  return (await children(q, tree(topicId)))
    .flatMap((name) => {
      const m = CHUNK.exec(name)
      return m && Number(m[1]) === topicId ? [{ name, topicId, fromMs: Number(m[2]), toMs: Number(m[3]) }] : []
    })
    .sort((a, b) => a.fromMs - b.fromMs)
}

/** Topic ids that have a tree under messages, or rows in messages_default. */
async function idsWithRows(q: Pick<pg.Pool, 'query'>): Promise<number[]> {
  const { rows } = await q.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'messages'::regclass`,
  )
  const ids = rows.flatMap((r) => {
    const m = TREE.exec(r.name)
    return m ? [Number(m[1])] : []
  })
  const strays = await q.query<{ id: number }>(`SELECT DISTINCT topic_id AS id FROM ${TOP_DEFAULT}`)
  return [...ids, ...strays.rows.map((r) => r.id)]
}

const bound = (ms: number) => (ms === 0 ? 'MINVALUE' : `'${new Date(ms).toISOString()}'`)
const msOf = (column: string) => `(extract(epoch FROM ${column}) * 1000)::float8`

// Span starts ($2 phase, $3 span) of a default partition's rows within the retention ($1 cutoff, ms).
const straySpans = (table: string, where: string) => `
SELECT DISTINCT (floor((${msOf('produced_at')} - $2) / $3) * $3 + $2)::float8 AS start
FROM ${table} WHERE ${where} produced_at >= to_timestamp($1 / 1000.0)`

/** Thrown inside the first transaction when strays turn up under the light lock: run again under the heavy one. */
class NeedsTreeLock extends Error {}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Maintains one topic's chunks: makes its tree if it has none, the chunks due and those that cover
 * its strays (filing them), then drops the chunks past its retention; a deleted topic's chunks go
 * and its tree is left an empty shell. Two transactions on a client of its own, each under the
 * topic's advisory lock; the drops run even when the first failed (else a topic whose chunk could
 * not be made, a lock not had, would keep every chunk past its retention). A topic whose rows are
 * in messages_legacy has no tree: maintainLegacy deletes its rows.
 */
export async function maintainTopicChunks(pool: pg.Pool, topicId: number, opts: ChunkMaintenanceOptions): Promise<TopicChunkResult> {
  const result: TopicChunkResult = { ran: false, created: [], dropped: [], droppedRows: 0, strayRows: 0, filedRows: 0, legacyRows: 0 }
  if (isLegacy(topicId, await legacyBound(pool))) return { ...result, ran: true }
  const client = await pool.connect()
  try {
    let failed: { err: unknown } | undefined
    // Each try counts into a result of its own, kept only if it commits (a rolled back one did nothing).
    const attempt = (heavy: boolean) =>
      withLockRetries(opts, async () => {
        const r: TopicChunkResult = { ...result, created: [...result.created], dropped: [...result.dropped] }
        const out = await inTopicLock(client, topicId, opts, () => fileAndMake(client, topicId, opts, r, heavy))
        if (out !== undefined) Object.assign(result, r)
        return out
      })
    try {
      // Until no chunk is left to make (one a transaction), bounded: a retention cut short can call
      // for many spans at once, the rest are made at the next sweep.
      for (let round = 0; round < 64; round++) {
        let more = await attempt(false).catch((err: unknown) => {
          if (err instanceof NeedsTreeLock) return 'heavy' as const
          throw err
        })
        if (more === 'heavy') more = await attempt(true)
        if (more === undefined) return result
        if (!more) break
      }
    } catch (err) {
      failed = { err }
    }
    result.ran = true
    await dropPastRetention(client, topicId, opts, result)
    if (failed) throw failed.err
    return result
  } finally {
    client.release()
  }
}

/**
 * The chunks past the topic's retention, dropped in a transaction of their own: the exclusive lock
 * on the tree is held only for it. The retention is read under the lock (it may have changed since
 * the first transaction). Group commit and reads of the topic wait behind that lock, so it is
 * waited for briefly (lockTimeoutMs, 100 ms) and tried again a few times after a jittered pause; a drop
 * that never gets it is tried at the next sweep.
 */
async function dropPastRetention(client: Client, topicId: number, opts: ChunkMaintenanceOptions, result: TopicChunkResult): Promise<void> {
  await withLockRetries(opts, () =>
    inTopicLock(client, topicId, { ...opts, wait: true }, async () => {
      const topic = await client.query<{ cutoff_ms: number }>(
        `SELECT ${msOf('clock_timestamp()')} - retention_ms::float8 AS cutoff_ms FROM topics WHERE id = $1`,
        [topicId],
      )
      if (topic.rows.length === 0) return
      const cutoffMs = topic.rows[0]!.cutoff_ms
      for (const c of (await listChunks(client, topicId)).filter((c) => c.toMs <= cutoffMs)) {
        // The planner's estimate (kept by vacuum and analyze): counting would read the whole chunk.
        const n = await client.query<{ n: number }>(`SELECT greatest(reltuples, 0)::float8 AS n FROM pg_class WHERE oid = $1::regclass`, [
          `"${c.name}"`,
        ])
        await client.query(`ALTER TABLE "${tree(topicId)}" DETACH PARTITION "${c.name}"`)
        await client.query(`DROP TABLE "${c.name}"`)
        result.droppedRows += n.rows[0]?.n ?? 0
        result.dropped.push(c.name)
      }
    }),
  )
}

/**
 * Runs a transaction again, a few times after a jittered pause, when its table lock timed out
 * (55P03, lock_not_available). A waiting ACCESS EXCLUSIVE request queues every later produce and
 * read of the topic behind it, so it waits briefly (lockTimeoutMs, 100 ms) and steps aside rather
 * than waiting long; one that never gets it is tried at the next sweep.
 */
async function withLockRetries<T>(opts: ChunkMaintenanceOptions, run: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run()
    } catch (err) {
      if ((err as { code?: string }).code !== '55P03' || attempt >= (opts.lockAttempts ?? 4)) throw err
      await sleep(20 + Math.random() * 80)
    }
  }
}

/** Runs `fn` in a transaction holding the topic's advisory lock; undefined when not taken (no wait). */
async function inTopicLock<T>(
  client: Client,
  topicId: number,
  opts: ChunkMaintenanceOptions,
  fn: () => Promise<T>,
): Promise<T | undefined> {
  await client.query('BEGIN')
  try {
    if (opts.wait) {
      await client.query('SELECT pg_advisory_xact_lock($1, $2)', [MAINTENANCE_LOCK, topicId])
    } else {
      const locked = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1, $2) AS ok', [MAINTENANCE_LOCK, topicId])
      if (!locked.rows[0]!.ok) {
        await client.query('ROLLBACK')
        return undefined
      }
    }
    await client.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.round(opts.lockTimeoutMs ?? 100))}`)
    const out = await fn()
    await client.query('COMMIT')
    return out
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {})
    throw err
  }
}

/**
 * The first transaction: tree, chunks due, strays filed. Locks, for a topic with a tree:
 * - no strays (the common case): SHARE ROW EXCLUSIVE on its default before anything is read, so
 *   no produce commits a row into it that the chunk being attached should hold (ATTACH would fail
 *   on it, and the whole transaction with it); produce into the chunks goes on;
 * - strays (`heavy`, rare): ACCESS EXCLUSIVE on the topic's tree while they move, so that no read
 *   of the topic runs between the move and the attach (it could miss the moved rows and take
 *   itself for caught up), nor any produce into the default.
 * Strays found under the light lock (produced between the look and the lock) throw NeedsTreeLock.
 * A topic without a tree: ACCESS EXCLUSIVE on messages_default (attaching the tree takes it anyway).
 */
async function fileAndMake(client: Client, topicId: number, opts: ChunkMaintenanceOptions, result: TopicChunkResult, heavy: boolean) {
  // Read under the lock, after the lock: see the header for why this tells a deleted topic apart.
  const topic = await client.query<{ retention_ms: number; now_ms: number }>(
    `SELECT retention_ms::float8 AS retention_ms, ${msOf('clock_timestamp()')} AS now_ms FROM topics WHERE id = $1`,
    [topicId],
  )
  const hasTree = (await client.query(`SELECT to_regclass($1) AS oid`, [tree(topicId)])).rows[0]!.oid !== null
  if (topic.rows.length === 0) {
    await dropDeletedTopic(client, topicId, hasTree, result)
    return false
  }
  const { retention_ms: retentionMs, now_ms: nowMs } = topic.rows[0]!
  const plan = chunkPlan(topicId, retentionMs, opts.sweepIntervalMs)
  const cutoffMs = nowMs - retentionMs
  const existing = hasTree ? await listChunks(client, topicId) : []
  const ahead: number[] = []
  for (let s = spanStart(nowMs, plan); s < nowMs + plan.aheadMs; s += plan.spanMs) ahead.push(s)
  // Strays: a topic without a tree has them in messages_default, one with a tree in its own default.
  const source = hasTree ? `"${topicDefault(topicId)}"` : TOP_DEFAULT
  const where = hasTree ? '' : `topic_id = ${topicId} AND`
  if (hasTree) {
    const any = (await client.query(`SELECT EXISTS (SELECT 1 FROM ${source}) AS any`)).rows[0]!.any as boolean
    if (any && !heavy) throw new NeedsTreeLock()
    // Nothing to make and nothing to file: no table lock at all (rows that arrive now wait for the next sweep).
    if (!any && chunksToCreate(topicId, existing, ahead, plan).length === 0) return false
    await client.query(
      heavy ? `LOCK TABLE "${tree(topicId)}" IN ACCESS EXCLUSIVE MODE` : `LOCK TABLE ${source} IN SHARE ROW EXCLUSIVE MODE`,
    )
  } else {
    // In the order ATTACH takes them (messages, then its default): two processes making two new
    // topics' trees at once would otherwise deadlock. Neither lock stops produce or reads of a topic
    // that has a tree.
    await client.query(`LOCK TABLE ONLY messages IN SHARE UPDATE EXCLUSIVE MODE`)
    await client.query(`LOCK TABLE ${TOP_DEFAULT} IN ACCESS EXCLUSIVE MODE`)
  }
  const gone = await client.query(`DELETE FROM ${source} WHERE ${where} produced_at < to_timestamp($1 / 1000.0)`, [cutoffMs])
  result.strayRows += gone.rowCount ?? 0
  const strays = await client.query<{ start: number }>(straySpans(source, where), [cutoffMs, plan.phaseMs, plan.spanMs])
  if (hasTree && !heavy && strays.rows.length > 0) throw new NeedsTreeLock()
  const made = chunksToCreate(topicId, existing, [...strays.rows.map((r) => r.start), ...ahead], plan)

  if (!hasTree) {
    // Made whole before it is attached: nothing reads or writes it until then. The parent has no
    // primary key (see the migration): each tree has its own.
    await client.query(
      `CREATE TABLE "${tree(topicId)}" (LIKE messages INCLUDING DEFAULTS, PRIMARY KEY (topic_id, partition, "offset", produced_at))
       PARTITION BY RANGE (produced_at)`,
    )
    await client.query(`CREATE TABLE "${topicDefault(topicId)}" (LIKE messages INCLUDING DEFAULTS)`)
    await client.query(`ALTER TABLE "${tree(topicId)}" ATTACH PARTITION "${topicDefault(topicId)}" DEFAULT`)
  }
  // One attach a transaction into a tree that is attached (the next chunk in the next): each holds
  // its locks (ACCESS EXCLUSIVE on the default) until the commit. A new tree is attached only once
  // it is whole: attaching chunks to it locks nothing anyone else uses.
  for (const c of hasTree ? made.slice(0, 1) : made) {
    await client.query(`CREATE TABLE "${c.name}" (LIKE messages INCLUDING DEFAULTS)`)
    if (hasTree) {
      // This chunk's strays move in before it is attached (attaching checks the default holds none).
      const moved = await client.query(
        `WITH moved AS (DELETE FROM "${topicDefault(topicId)}"
                        WHERE produced_at >= to_timestamp($1 / 1000.0) AND produced_at < to_timestamp($2 / 1000.0) RETURNING *)
         INSERT INTO "${c.name}" SELECT * FROM moved`,
        [c.fromMs, c.toMs],
      )
      result.filedRows += moved.rowCount ?? 0
    }
    await client.query(
      `ALTER TABLE "${tree(topicId)}" ATTACH PARTITION "${c.name}" FOR VALUES FROM (${bound(c.fromMs)}) TO (${bound(c.toMs)})`,
    )
    result.created.push(c.name)
  }
  if (!hasTree) {
    const moved = await client.query(
      `WITH moved AS (DELETE FROM ${TOP_DEFAULT} WHERE topic_id = $1 RETURNING *) INSERT INTO "${tree(topicId)}" SELECT * FROM moved`,
      [topicId],
    )
    result.filedRows += moved.rowCount ?? 0
    await client.query(`ALTER TABLE messages ATTACH PARTITION "${tree(topicId)}" FOR VALUES FROM (${topicId}) TO (${topicId + 1})`)
  }
  return hasTree && made.length > 1
}

/**
 * A deleted topic: its chunks dropped and its default emptied under ACCESS EXCLUSIVE on its tree
 * only, its strays in messages_default deleted. The empty tree stays attached, renamed
 * messages_gone_t<id> (so that sweeps pass it by): detaching it from messages takes ACCESS
 * EXCLUSIVE on messages, and every produce to every topic waits behind it, so that is done for
 * many at once (removeGoneTrees). No produce can add to it: the topic's partition rows, which
 * produce updates, went with the topic.
 */
async function dropDeletedTopic(client: Client, topicId: number, hasTree: boolean, result: TopicChunkResult): Promise<void> {
  const gone = await client.query(`DELETE FROM ${TOP_DEFAULT} WHERE topic_id = $1`, [topicId])
  result.strayRows += gone.rowCount ?? 0
  if (!hasTree) return
  result.droppedRows += (await client.query<{ n: number }>(`SELECT count(*)::float8 AS n FROM "${tree(topicId)}"`)).rows[0]!.n
  await client.query(`LOCK TABLE "${tree(topicId)}" IN ACCESS EXCLUSIVE MODE`)
  for (const c of await listChunks(client, topicId)) {
    await client.query(`ALTER TABLE "${tree(topicId)}" DETACH PARTITION "${c.name}"`)
    await client.query(`DROP TABLE "${c.name}"`)
    result.dropped.push(c.name)
  }
  await client.query(`TRUNCATE "${topicDefault(topicId)}"`)
  await client.query(`ALTER TABLE "${topicDefault(topicId)}" RENAME TO "${goneTree(topicId)}_default"`)
  await client.query(`ALTER TABLE "${tree(topicId)}" RENAME TO "${goneTree(topicId)}"`)
  result.dropped.push(tree(topicId))
}

// The rows of messages_legacy (see the migration) past their topic's retention, or of a deleted
// topic, one bounded slice a statement from the front of each partition (no slice leaves a hole
// mid-log): row by row, as before the chunks, for the topics that existed when messages was split.
const DELETE_LEGACY = `
DELETE FROM messages_legacy m USING (
  SELECT topic_id, partition, "offset" FROM messages_legacy
  WHERE topic_id = $1 AND ($2::bigint IS NULL OR produced_at < clock_timestamp() - $2::bigint * interval '1 millisecond')
  ORDER BY partition, "offset"
  LIMIT $3
) doomed
WHERE m.topic_id = doomed.topic_id AND m.partition = doomed.partition AND m."offset" = doomed."offset"`

/**
 * The first topic id messages_legacy does not hold: it is the partition FROM (MINVALUE) TO (this),
 * and every topic created since has an id at or above it (the migration started the id sequence
 * there). Undefined once it is dropped (or a new database never had it).
 */
export async function legacyBound(q: Pick<pg.Pool, 'query'>): Promise<number | undefined> {
  const { rows } = await q.query<{ bound: string }>(
    `SELECT pg_get_expr(c.relpartbound, c.oid) AS bound FROM pg_class c WHERE c.oid = to_regclass('messages_legacy') AND c.relispartition`,
  )
  const m = rows[0] && /TO \((\d+)\)/.exec(rows[0].bound)
  if (rows[0] && !m) throw new Error(`messages_legacy has a bound this version does not know: ${rows[0].bound}`)
  return m ? Number(m[1]) : undefined
}

/** Whether a topic's rows are messages_legacy's (its id is below the bound). */
export const isLegacy = (topicId: number, bound: number | undefined) => bound !== undefined && topicId < bound

/** The distinct topic ids of messages_legacy's rows: a walk of its primary key, one probe a topic (not a scan). */
const LEGACY_ROW_IDS = `
WITH RECURSIVE walk(id) AS (
  SELECT min(topic_id) FROM messages_legacy
  UNION ALL
  SELECT (SELECT min(topic_id) FROM messages_legacy WHERE topic_id > walk.id) FROM walk WHERE walk.id IS NOT NULL
)
SELECT id FROM walk WHERE id IS NOT NULL`

/**
 * messages_legacy: deletes its rows past their topic's retention (all of a deleted topic's), in
 * slices; once no topic of its is left and it is empty, detaches and drops it. That detach takes
 * ACCESS EXCLUSIVE on messages, once in the table's life, under a short lock_timeout (tried again
 * at the next sweep).
 */
async function maintainLegacy(
  pool: pg.Pool,
  bound: number | undefined,
  opts: ChunkMaintenanceOptions & { stopped?: () => boolean },
  done: ChunkMaintenanceResult,
): Promise<void> {
  if (bound === undefined) return
  const live = new Map(
    (await pool.query<{ id: number; retention_ms: string }>('SELECT id, retention_ms::text FROM topics WHERE id < $1', [bound])).rows.map(
      (r) => [r.id, r.retention_ms],
    ),
  )
  const ids = new Set([...live.keys(), ...(await pool.query<{ id: number }>(LEGACY_ROW_IDS)).rows.map((r) => r.id)])
  for (const id of [...ids].sort((a, b) => a - b)) {
    for (;;) {
      if (opts.stopped?.()) return
      const res = await pool.query(DELETE_LEGACY, [id, live.get(id) ?? null, opts.legacySliceRows ?? 10_000])
      done.legacyRows += res.rowCount ?? 0
      // Only an empty slice is the end: another sweeper's slice may have taken some of this one's rows.
      if ((res.rowCount ?? 0) === 0) break
    }
  }
  if (live.size > 0) return
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    try {
      await client.query(`SET LOCAL lock_timeout = 100`)
      // No topic of its is left, so no produce or read reaches it: empty now, empty for good.
      if ((await client.query('SELECT 1 FROM messages_legacy LIMIT 1')).rows.length === 0) {
        await client.query('ALTER TABLE messages DETACH PARTITION messages_legacy')
        await client.query('DROP TABLE messages_legacy')
        done.dropped.push('messages_legacy')
      }
      await client.query('COMMIT')
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {})
      done.failed.push({ topicId: 0, err })
    }
  } finally {
    client.release()
  }
}

/** Every topic's TopicChunkResult added up. */
export interface ChunkMaintenanceResult extends Omit<TopicChunkResult, 'ran'> {
  /** Topics whose maintenance failed (a lock timeout): tried again at the next sweep. */
  failed: { topicId: number; err: unknown }[]
}

/**
 * Maintains every topic's chunks, one topic at a time: the topics and the trees and strays of
 * topics that are gone. A topic that fails (a lock not had in time) does not stop the others.
 */
export async function maintainMessageChunks(
  pool: pg.Pool,
  opts: ChunkMaintenanceOptions & { stopped?: () => boolean },
): Promise<ChunkMaintenanceResult> {
  const done: ChunkMaintenanceResult = { created: [], dropped: [], droppedRows: 0, strayRows: 0, filedRows: 0, legacyRows: 0, failed: [] }
  const topics = await pool.query<{ id: number }>('SELECT id FROM topics')
  const legacy = await legacyBound(pool)
  const ids = new Set([...topics.rows.map((r) => r.id), ...(await idsWithRows(pool))].filter((id) => !isLegacy(id, legacy)))
  for (const id of [...ids].sort((a, b) => a - b)) {
    if (opts.stopped?.()) break
    try {
      const r = await maintainTopicChunks(pool, id, opts)
      done.created.push(...r.created)
      done.dropped.push(...r.dropped)
      done.droppedRows += r.droppedRows
      done.strayRows += r.strayRows
      done.filedRows += r.filedRows
    } catch (err) {
      done.failed.push({ topicId: id, err })
    }
  }
  await maintainLegacy(pool, legacy, opts, done)
  if (!opts.stopped?.()) await removeGoneTrees(pool, opts, done)
  return done
}

/** The deleted topics' empty trees attached to messages (messages_gone_t<id>). */
async function goneTrees(q: Pick<pg.Pool, 'query'>): Promise<string[]> {
  const { rows } = await q.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'messages'::regclass ORDER BY 1`,
  )
  return rows.map((r) => r.name).filter((name) => GONE_TREE.test(name))
}

// Shells detached but not dropped (a process that stopped between the two): nothing attached, no lock on messages to drop them.
const DETACHED_SHELLS = `
SELECT c.relname AS name FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'p' AND NOT c.relispartition AND c.relname ~ '^messages_gone_t[0-9]+$'
ORDER BY 1`

/**
 * Deleted topics' empty trees (messages_gone_t<id>, two empty tables each, see dropDeletedTopic),
 * detached from messages and dropped once there are goneTreesBatch (16) of them: else the catalog,
 * and the partition descriptor every plan of messages loads, grows with topic churn for ever.
 * Detaching takes ACCESS EXCLUSIVE on messages (DETACH ... CONCURRENTLY is refused where a default
 * partition exists, and messages_default is one), which every topic's produce and reads wait for;
 * so a batch of them is detached under one lock (ONLY messages: not every partition's), waited for
 * lockTimeoutMs (100 ms) at most, a few tries with a jittered pause like the chunks' locks (a
 * request queued longer would hold every produce behind it), by one process at a time (the advisory
 * maintenance lock with key 0, which no topic has). Only the detaches run under it
 * (catalog work: the trees are empty and detaching scans nothing; measured ~3-4 ms a shell on the
 * loaded 2-core machine), the drops after its commit (~20-25 ms a shell, which under the lock
 * would have stalled every produce ~400 ms a batch). The list is read again under the lock:
 * another process may have detached them meanwhile. Not had in time: the next sweep tries again.
 */
async function removeGoneTrees(pool: pg.Pool, opts: ChunkMaintenanceOptions, done: ChunkMaintenanceResult): Promise<void> {
  const batch = opts.goneTreesBatch ?? 16
  const client = await pool.connect()
  try {
    if ((await goneTrees(client)).length >= batch) {
      await withLockRetries(opts, async () => {
        await client.query('BEGIN')
        try {
          // One process at a time (the others pass: the next sweep looks again), so that several
          // cannot each stall every produce in turn.
          const mine = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1, 0) AS ok', [MAINTENANCE_LOCK])
          if (!mine.rows[0]!.ok) {
            await client.query('ROLLBACK')
            return
          }
          await client.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.round(opts.lockTimeoutMs ?? 100))}`)
          // The default partition first: a DETACH takes it too, and lock_timeout bounds each wait on
          // its own, so taken second it could hold messages (every produce and read) through a
          // second wait. Alone, its lock holds up only the rows of topics without a tree.
          await client.query('LOCK TABLE ONLY messages_default IN ACCESS EXCLUSIVE MODE')
          await client.query('LOCK TABLE ONLY messages IN ACCESS EXCLUSIVE MODE')
          // At most a batch a lock, however many have gathered (lock failures), so that one stall stays short.
          for (const name of (await goneTrees(client)).slice(0, batch)) {
            await client.query(`ALTER TABLE messages DETACH PARTITION "${name}"`)
          }
          await client.query('COMMIT')
        } catch (err) {
          await client.query('ROLLBACK').catch(() => {})
          throw err
        }
      })
    }
    // Detached now or by an earlier sweep that stopped before dropping them; two processes may
    // both come here: the second's DROP finds nothing (IF EXISTS).
    for (const { name } of (await client.query<{ name: string }>(DETACHED_SHELLS)).rows) {
      // Its (empty) default partition goes with it.
      await client.query(`DROP TABLE IF EXISTS "${name}"`)
      done.dropped.push(name)
    }
  } catch (err) {
    done.failed.push({ topicId: 0, err })
  } finally {
    client.release()
  }
}

/**
 * The SQL of broker processes sharing one database (see src/cluster/ownership.ts).
 *
 * - Each process holds a session of its own (MemberSession). On it, it holds the members' lock in
 *   shared mode and records its URL in broker_members under its backend pid. A member is live while
 *   that backend holds the lock: PostgreSQL releases a session's locks whenever it ends, however it
 *   ends (the process killed, the connection cut, the server restarted), so there is no lease to
 *   expire and no clock to trust, and a dead member's row is never believed.
 * - Owning a (group, partition) is holding its exclusive session advisory lock on the same session.
 *   The lock decides who may take a partition; group_offsets.owner_epoch fences the writes (see
 *   claimPartition and src/store/consumption.ts), since those run on pool connections, not on the
 *   session, and may be late.
 * - Members tell each other what changed with NOTIFY; each LISTENs on its session.
 */
import pg from 'pg'
import { inTransaction, type Database, type Queryable } from './db.ts'
import { findAttempts, settleHandedOver, updateAttempts, type HandedOverChange } from './deliveries.ts'

/** Advisory lock key of membership ("hkqB"), held in shared mode by every member. */
export const MEMBERS_LOCK_KEY = 0x686b7142
/**
 * The high 32 bits of a partition's lock key are PARTITION_LOCK_BASE + group id, the low 32 the
 * partition; pg_locks shows them as classid and objid. Group ids stay below 2^27 (the base leaves
 * room for them under 2^31), far beyond any serial a database of groups reaches.
 */
export const PARTITION_LOCK_BASE = 0x48000000
const MAX_GROUP_ID = 0x07ffffff

/** NOTIFY channels: messages appended, and groups, topics or offsets changed, by any member. */
export const APPEND_CHANNEL = 'hookq_append'
export const CHANGE_CHANNEL = 'hookq_change'
/** Sent by PostgreSQL when a transaction that called hookq_produce() commits (a trigger on produce_outbox). */
export const OUTBOX_CHANNEL = 'hookq_outbox'
/**
 * Advisory lock key ("hkqW") a member holds exclusively while it waits for hookq_produce() commits:
 * only then do committing callers NOTIFY (the outbox_notify_when_idle migration says why).
 */
export const OUTBOX_WAIT_KEY = 0x686b7157
/** Whether this member now holds the outbox's wait lock: just taken, held already, held by another member, or taken by no one as committers hold it shared. */
export type OutboxWait = 'taken' | 'held' | 'elsewhere' | 'busy'

// Tries the wait lock; when refused, whether another member holds it (or committers, shared).
const TRY_OUTBOX_WAIT = `
SELECT pg_try_advisory_lock($1::bigint) AS ok,
       EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = 0 AND l.objid::bigint = $1::bigint AND l.objsubid = 1 AND l.pid <> pg_backend_pid()) AS elsewhere`

/** How long closing the session waits for the server before dropping the socket. */
const CLOSE_WAIT_MS = 1000
/** NOTIFY payloads must stay under 8000 bytes. */
export const MAX_PAYLOAD_BYTES = 7900

/** The 64-bit key of a partition's lock, as the decimal text pg takes for a bigint. */
export function partitionLockKey(groupId: number, partition: number): string {
  if (!Number.isSafeInteger(groupId) || groupId < 0 || groupId > MAX_GROUP_ID)
    throw new Error(`group id ${groupId} is out of the lock key's range`)
  return String((BigInt(PARTITION_LOCK_BASE + groupId) << 32n) | BigInt(partition))
}

/** A live member: its lock session's backend pid and the URL it takes forwarded calls on. */
export interface Member {
  pid: number
  url: string | null
}

/** A partition's current holder. */
export interface Holder {
  groupId: number
  partition: number
  pid: number
}

/** Every (group, partition) there is to push: groups whose topic exists. */
export interface GroupPartitions {
  groupId: number
  name: string
  partitions: number
}

/** What a member sees of the cluster in one query: who is live and who holds which partition. */
export interface ClusterView {
  self: number
  members: Member[]
  holders: Holder[]
  groups: GroupPartitions[]
}

/** A dedicated session: the members' lock, the partition locks and LISTEN live on it, and die with it. */
export class MemberSession {
  private lostHandler: ((err: Error | undefined) => void) | undefined
  private lost = false
  /** The session's backend pid (known once joined). */
  pid = 0
  /** The last query asked for: the next one runs after it (see query). */
  private queue: Promise<void> = Promise.resolve()
  /**
   * When (performance.now(), a monotonic clock that runs on while the process is stopped) the last
   * query answered on this session was sent: the server cannot have ended the session for being
   * idle before this plus its idle_session_timeout (see Ownership's lease).
   */
  provenAtMs = performance.now()
  /**
   * The same instant on the wall clock. Linux's monotonic clock stops while the machine sleeps (a
   * suspended laptop or VM), the server's does not: the lease needs both to say it is recent.
   */
  provenAtWallMs = Date.now()
  /** This session holds OUTBOX_WAIT_KEY (once: a session's advisory locks stack). */
  private outboxWaiting = false

  private constructor(private readonly client: pg.Client) {
    const onLost = (err?: Error) => {
      if (this.lost) return
      this.lost = true
      this.lostHandler?.(err)
    }
    client.on('error', onLost)
    client.on('end', () => onLost())
  }

  /**
   * Connects; `onNotify` hears every NOTIFY on the channels listened to.
   * - `queryTimeoutMs`: no query on this session may hang a poll longer.
   * - `idleTimeoutMs`: the server ends the session after this long without a query
   *   (idle_session_timeout, PostgreSQL 14+), so a member that froze or was cut off silently loses
   *   its partitions; its polls keep it busy meanwhile. Set above the time a member takes to give up
   *   on its own (`queryTimeoutMs` past a missed poll), so it has stopped pushing before its locks go.
   */
  static async open(
    connectionString: string,
    opts: { queryTimeoutMs: number; idleTimeoutMs: number },
    onNotify: (channel: string, payload: string) => void,
  ): Promise<MemberSession> {
    const client = new pg.Client({
      connectionString,
      application_name: 'hookq-member',
      keepAlive: true,
      query_timeout: opts.queryTimeoutMs,
      connectionTimeoutMillis: opts.queryTimeoutMs,
    })
    const session = new MemberSession(client)
    client.on('notification', (n) => onNotify(n.channel, n.payload ?? ''))
    await client.connect()
    try {
      await client.query(`SET idle_session_timeout = ${Math.floor(opts.idleTimeoutMs)}`)
    } catch (err) {
      // 42704: PostgreSQL 13 has no such setting; a silent cut is then noticed by TCP keepalive only.
      if ((err as { code?: string }).code !== '42704') throw err
    }
    return session
  }

  /** Becomes a member reachable at `url` (null: the others cannot forward to it), listening for changes. */
  async join(url: string | null): Promise<void> {
    const { rows } = await this.query<{ pid: number }>('SELECT pg_advisory_lock_shared($1), pg_backend_pid() AS pid', [MEMBERS_LOCK_KEY])
    this.pid = rows[0]!.pid
    await this.record(url)
    for (const channel of [APPEND_CHANNEL, CHANGE_CHANNEL, OUTBOX_CHANNEL]) await this.query(`LISTEN ${pg.escapeIdentifier(channel)}`)
  }

  /** Records where this member takes forwarded calls (its row replaces a dead backend's of the same pid). */
  async record(url: string | null): Promise<void> {
    await this.query(
      `INSERT INTO broker_members (backend_pid, url, since) VALUES (pg_backend_pid(), $1, now())
       ON CONFLICT (backend_pid) DO UPDATE SET url = EXCLUDED.url, since = EXCLUDED.since`,
      [url],
    )
  }

  /**
   * The live members, the partitions' holders and the groups, in one round trip on the session:
   * also the proof that the session (and every lock on it) is still ours.
   */
  async view(): Promise<ClusterView> {
    const res = await this.query<{ kind: string; a: number; b: number; c: number; url: string | null; name: string | null }>(VIEW, [
      MEMBERS_LOCK_KEY,
      PARTITION_LOCK_BASE,
      MAX_GROUP_ID,
    ])
    const view: ClusterView = { self: this.pid, members: [], holders: [], groups: [] }
    for (const r of res.rows) {
      if (r.kind === 'm') view.members.push({ pid: r.a, url: r.url })
      else if (r.kind === 'h') view.holders.push({ groupId: r.a, partition: r.b, pid: r.c })
      else view.groups.push({ groupId: r.a, name: r.name!, partitions: r.b })
    }
    return view
  }

  /** Takes a partition's lock if nobody holds it; never waits. */
  async tryLock(groupId: number, partition: number): Promise<boolean> {
    const { rows } = await this.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1::bigint) AS ok', [
      partitionLockKey(groupId, partition),
    ])
    return rows[0]?.ok === true
  }

  /** Gives a partition's lock up (for another member to take). */
  async unlock(groupId: number, partition: number): Promise<void> {
    await this.query('SELECT pg_advisory_unlock($1::bigint)', [partitionLockKey(groupId, partition)])
  }

  /** Takes the outbox's wait lock unless this session holds it already (see OutboxWait). */
  async waitForOutbox(): Promise<OutboxWait> {
    if (this.outboxWaiting) return 'held'
    const { rows } = await this.query<{ ok: boolean; elsewhere: boolean }>(TRY_OUTBOX_WAIT, [OUTBOX_WAIT_KEY])
    if (rows[0]?.ok) {
      this.outboxWaiting = true
      return 'taken'
    }
    return rows[0]?.elsewhere ? 'elsewhere' : 'busy'
  }

  /** Gives the outbox's wait lock up, if held: committers stop notifying (this member is moving rows). */
  async stopWaitingForOutbox(): Promise<void> {
    if (!this.outboxWaiting) return
    this.outboxWaiting = false
    await this.query('SELECT pg_advisory_unlock($1::bigint)', [OUTBOX_WAIT_KEY])
  }

  /** NOTIFY on this session (it does not wait for a pool connection). */
  async notify(channel: string, payload: string): Promise<void> {
    await this.query('SELECT pg_notify($1, $2)', [channel, payload])
  }

  /** Drops the socket at once (a session that stopped answering cannot be ended politely). */
  destroy(): void {
    this.lost = true
    const stream = (this.client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream
    stream?.destroy()
  }

  /**
   * One query at a time on the session, in the order asked: polls, moves and NOTIFY share it, and
   * pg only queues overlapping queries with a deprecation warning (pg 9 will refuse them).
   */
  private query<R extends pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>> {
    const run = this.queue.then(async () => {
      const sentAtMs = performance.now()
      const sentAtWallMs = Date.now()
      const result = await this.client.query<R>(text, values)
      // The server's idle clock restarted no earlier than this query was sent.
      if (sentAtMs > this.provenAtMs) {
        this.provenAtMs = sentAtMs
        this.provenAtWallMs = sentAtWallMs
      }
      return result
    })
    this.queue = run.then(
      () => undefined,
      () => undefined,
    )
    return run
  }

  /** Called once, when the session ends or fails: whatever it held is gone. */
  onLost(handler: (err: Error | undefined) => void): void {
    this.lostHandler = handler
  }

  get isLost(): boolean {
    return this.lost
  }

  /**
   * Ends the session: its locks and LISTENs go with it. A polite end waits for the server, which
   * may never answer (a cut connection): after a second the socket is dropped instead.
   */
  async close(): Promise<void> {
    this.lost = true
    let timer: NodeJS.Timeout | undefined
    const gaveUp = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, CLOSE_WAIT_MS)
    })
    await Promise.race([this.client.end().catch(() => {}), gaveUp])
    clearTimeout(timer)
    this.destroy()
  }
}

// Advisory locks of this database only: keys are per database, and pg_locks shows every database's.
const VIEW = `
WITH locks AS MATERIALIZED (
  SELECT l.pid, l.classid::bigint AS hi, l.objid::bigint AS lo, l.mode FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT 'm' AS kind, m.backend_pid AS a, 0 AS b, 0 AS c, m.url, NULL::text AS name
FROM broker_members m WHERE EXISTS (SELECT 1 FROM locks WHERE locks.pid = m.backend_pid AND hi = 0 AND lo = $1 AND mode = 'ShareLock')
UNION ALL
SELECT 'h', (hi - $2)::int, lo::int, pid, NULL, NULL FROM locks WHERE hi >= $2 AND hi <= $2 + $3 AND mode = 'ExclusiveLock'
UNION ALL
SELECT 'g', g.id, t.partitions, 0, NULL, g.name FROM consumer_groups g JOIN topics t ON t.name = g.topic`

/**
 * Makes this member the partition's writer: bumps its owner epoch and returns the new one, which
 * every write for the partition names from now on (null: the group or its offsets are gone). Run
 * only while holding the partition's lock. Waits for a write of the previous owner still under way
 * (it holds the row, see src/store/consumption.ts), so the progress read after this includes it and
 * any later write of the previous owner is refused.
 */
export async function claimPartition(q: Queryable, groupId: number, partition: number): Promise<number | null> {
  const { rows } = await q.query<{ epoch: string }>(
    `UPDATE group_offsets o SET owner_epoch = o.owner_epoch + 1
     FROM consumer_groups g JOIN topics t ON t.name = g.topic
     WHERE g.id = $1 AND o.group_id = g.id AND o.topic_id = t.id AND o.partition = $2
     RETURNING o.owner_epoch::text AS epoch`,
    [groupId, partition],
  )
  return rows[0] ? Number(rows[0].epoch) : null
}

/**
 * The URL of the member that holds a partition's lock right now (null: nobody, or it took no
 * forwarded calls): where a call goes when the last view is stale (its owner died, a new one took it).
 */
export async function holderUrl(q: Queryable, groupId: number, partition: number): Promise<string | null> {
  if (!Number.isSafeInteger(groupId) || groupId < 0 || groupId > MAX_GROUP_ID) return null
  const { rows } = await q.query<{ url: string | null }>(
    `SELECT m.url FROM pg_locks l JOIN broker_members m ON m.backend_pid = l.pid
     WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted AND l.objsubid = 1
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid::bigint = $1 AND l.objid::bigint = $2`,
    [PARTITION_LOCK_BASE + groupId, partition],
  )
  return rows[0]?.url ?? null
}

/**
 * Acks of a partition that no process holds right now (its owner died, the next one has yet to take
 * it): written here, durably, instead of being refused. In one transaction: the partition's lock
 * taken for the transaction (none is granted while a member holds it, and no member can take it
 * until this commits, so its next owner loads these completions), its owner epoch bumped (a process
 * that lost it without noticing can write nothing more for it, a dead letter of these messages
 * included), then each id whose attempt row exists (of the partition's life since its last seek)
 * completed. Returns the status of each id written ('acked', or 'already_completed' below the
 * committed offset); null when the partition is held after all. Ids without a row are left out:
 * their owner's answer (or a retry) says what they are.
 */
export async function ackUnowned(
  db: Database,
  groupId: number,
  partition: number,
  ids: string[],
): Promise<Map<string, 'acked' | 'already_completed'> | null> {
  return inTransaction(db, async (client) => {
    const row = await takeUnowned(client, groupId, partition)
    if (!row) return null
    const committed = Number(row.committed)
    const found = await findAttempts(client, groupId, ids)
    const out = new Map<string, 'acked' | 'already_completed'>()
    const offsets: number[] = []
    for (const [id, a] of found) {
      if (a.partition !== partition || a.topicId !== row.topic_id || a.startedAtMs < (row.seeked_ms ?? 0)) continue
      out.set(id, a.offset < committed ? 'already_completed' : 'acked')
      if (a.offset >= committed) offsets.push(a.offset)
    }
    if (offsets.length > 0)
      await client.query(
        `INSERT INTO group_completions (group_id, topic_id, partition, "offset")
         SELECT $1, $2, $3, x FROM unnest($4::bigint[]) AS x ON CONFLICT DO NOTHING`,
        [groupId, row.topic_id, partition, offsets],
      )
    // The committed offset moves past the completions now contiguous with it (its lag then says so).
    const done = await client.query<{ offset: string }>(
      `SELECT "offset"::text AS offset FROM group_completions WHERE group_id = $1 AND topic_id = $2 AND partition = $3 AND "offset" >= $4 ORDER BY "offset"`,
      [groupId, row.topic_id, partition, committed],
    )
    let to = committed
    for (const d of done.rows) {
      if (Number(d.offset) !== to) break
      to++
    }
    if (to > committed) {
      await client.query(
        `UPDATE group_offsets SET committed_offset = $4, pushed_offset = GREATEST(pushed_offset, $4)
         WHERE group_id = $1 AND topic_id = $2 AND partition = $3`,
        [groupId, row.topic_id, partition, to],
      )
      await client.query(`DELETE FROM group_completions WHERE group_id = $1 AND topic_id = $2 AND partition = $3 AND "offset" < $4`, [
        groupId,
        row.topic_id,
        partition,
        to,
      ])
    }
    const now = Date.now()
    await updateAttempts(
      client,
      [...out].filter(([, status]) => status === 'acked').map(([id]) => ({ id, outcome: 'acked' as const, finishedAtMs: now })),
    )
    return out
  })
}

/**
 * The partition's lock for this transaction and its owner epoch bumped (see ackUnowned): its
 * offsets row, or null when a member holds the partition (or the group or its topic is gone).
 */
async function takeUnowned(
  client: Queryable,
  groupId: number,
  partition: number,
): Promise<{ topic_id: number; committed: string; seeked_ms: number | null } | null> {
  const lock = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1::bigint) AS ok', [
    partitionLockKey(groupId, partition),
  ])
  if (lock.rows[0]?.ok !== true) return null
  const o = await client.query<{ topic_id: number; committed: string; seeked_ms: number | null }>(
    `UPDATE group_offsets o SET owner_epoch = o.owner_epoch + 1
     FROM consumer_groups g JOIN topics t ON t.name = g.topic
     WHERE g.id = $1 AND o.group_id = g.id AND o.topic_id = t.id AND o.partition = $2
     RETURNING o.topic_id, o.committed_offset::text AS committed, (extract(epoch from o.seeked_at) * 1000)::float8 AS seeked_ms`,
    [groupId, partition],
  )
  return o.rows[0] ?? null
}

/**
 * Nacks or extends (see HandedOverChange) of a partition nobody holds, written here as ackUnowned writes acks, instead of 503.
 * An attempt its last owner handed over in flight (HANDED_OVER) gets the nack or the new deadline
 * on its row, which the next owner reads when it takes the partition (it pushes the message again
 * no earlier). Any other attempt of the partition's life is settled or not current any more:
 * `already_completed`, as its owner would answer. When an id has no row, nothing is written (503, asked again).
 */
export async function settleUnowned(
  db: Database,
  groupId: number,
  partition: number,
  ids: string[],
  change: HandedOverChange,
): Promise<Map<string, 'nacked' | 'extended' | 'already_completed'> | null> {
  return inTransaction(db, async (client) => {
    const row = await takeUnowned(client, groupId, partition)
    if (!row) return null
    const committed = Number(row.committed)
    const found = await findAttempts(client, groupId, ids)
    const live = [...found].filter(
      ([, a]) => a.partition === partition && a.topicId === row.topic_id && a.startedAtMs >= (row.seeked_ms ?? 0),
    )
    // An id without a row here makes the call 503 (asked again): write none of it, so that the
    // retry finds the same rows and answers the same.
    if (live.length < ids.length) return new Map()
    const changed = await settleHandedOver(
      client,
      groupId,
      partition,
      live.filter(([, a]) => a.offset >= committed).map(([id]) => id),
      change,
    )
    const done = change.verb === 'nack' ? 'nacked' : 'extended'
    return new Map(live.map(([id]) => [id, changed.has(id) ? done : 'already_completed']))
  })
}

/** The owner epochs in the database now, "groupId:partition" → epoch, of the partitions asked about. */
export async function ownerEpochs(
  q: Queryable,
  keys: { groupId: number; topicId: number; partition: number }[],
): Promise<Map<string, number>> {
  if (keys.length === 0) return new Map()
  const { rows } = await q.query<{ group_id: number; partition: number; epoch: string }>(
    `SELECT o.group_id, o.partition, o.owner_epoch::text AS epoch FROM group_offsets o
     JOIN unnest($1::int[], $2::int[], $3::int[]) AS k(g, t, p) ON o.group_id = k.g AND o.topic_id = k.t AND o.partition = k.p`,
    [keys.map((k) => k.groupId), keys.map((k) => k.topicId), keys.map((k) => k.partition)],
  )
  return new Map(rows.map((r) => [`${r.group_id}:${r.partition}`, Number(r.epoch)]))
}

/** Every group whose topic exists, with its partition count (what a process alone owns). */
export async function groupPartitions(q: Queryable): Promise<GroupPartitions[]> {
  const { rows } = await q.query<{ id: number; name: string; partitions: number }>(
    'SELECT g.id, g.name, t.partitions FROM consumer_groups g JOIN topics t ON t.name = g.topic',
  )
  return rows.map((r) => ({ groupId: r.id, name: r.name, partitions: r.partitions }))
}

/** Members whose session is gone leave rows behind: removed now and then by any member. */
export async function forgetDeadMembers(q: Queryable): Promise<void> {
  await q.query(
    `DELETE FROM broker_members m WHERE NOT EXISTS (
       SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = m.backend_pid
         AND l.classid = 0 AND l.objid = $1 AND l.objsubid = 1)`,
    [MEMBERS_LOCK_KEY],
  )
}

/** NOTIFY on a channel (after the caller's commit: NOTIFY outside a transaction is sent at once). */
export async function publish(q: Queryable, channel: string, payload: string): Promise<void> {
  await q.query('SELECT pg_notify($1, $2)', [channel, payload])
}

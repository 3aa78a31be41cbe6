/**
 * The SQL of leadership between broker processes on one database (see src/cluster/leadership.ts).
 *
 * - The leader holds a session advisory lock on a connection of its own. PostgreSQL releases it
 *   when that session ends, however it ends (the process killed, the connection cut, the server
 *   restarted), so there is no lease to expire and no clock to trust.
 * - The leader writes its URL into the one row of broker_leader, with its backend pid. A row is
 *   trusted only while that backend still holds the lock, so a dead leader's row is never used.
 * - Followers tell the leader what changed with NOTIFY on the leader's connection's channels.
 */
import pg from 'pg'

/** Advisory lock key of the leader ("hkqL"); advisory keys are per database. */
export const LEADER_LOCK_KEY = 0x686b714c

/** NOTIFY channels: messages appended by a follower, and groups or topics it changed. */
export const APPEND_CHANNEL = 'hookq_append'
export const CHANGE_CHANNEL = 'hookq_change'
/** How long closing the lock session waits for the server before dropping the socket. */
const CLOSE_WAIT_MS = 1000
/** NOTIFY payloads must stay under 8000 bytes. */
export const MAX_PAYLOAD_BYTES = 7900

/** A dedicated session: the advisory lock and LISTEN live on it, and die with it. */
export class LeaderConnection {
  private lostHandler: ((err: Error | undefined) => void) | undefined
  private lost = false

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
   * Connects; `onNotify` hears every NOTIFY on the channels listened to later.
   * - `queryTimeoutMs`: no query on this session may hang a campaign or a heartbeat longer.
   * - `idleTimeoutMs`: the server ends the session after this long without a query
   *   (idle_session_timeout, PostgreSQL 14+), so a holder that froze or was cut off silently
   *   releases the lock; the leader's heartbeats keep it busy meanwhile. Set it above the time the
   *   leader takes to give up on its own (`queryTimeoutMs` past a missed heartbeat), so the old
   *   leader has stopped pushing before the lock is free.
   */
  static async open(connectionString: string, opts: { queryTimeoutMs: number; idleTimeoutMs: number },
    onNotify: (channel: string, payload: string) => void): Promise<LeaderConnection> {
    const client = new pg.Client({
      connectionString, application_name: 'hookq-leader', keepAlive: true, query_timeout: opts.queryTimeoutMs,
      connectionTimeoutMillis: opts.queryTimeoutMs,
    })
    const conn = new LeaderConnection(client)
    client.on('notification', (n) => onNotify(n.channel, n.payload ?? ''))
    await client.connect()
    try {
      await client.query(`SET idle_session_timeout = ${Math.floor(opts.idleTimeoutMs)}`)
    } catch (err) {
      // 42704: PostgreSQL 13 has no such setting; a silent cut is then noticed by TCP keepalive only.
      if ((err as { code?: string }).code !== '42704') throw err
    }
    return conn
  }

  /** A round trip on the session: proof that it (and so the lock) is still ours. */
  async heartbeat(): Promise<void> {
    await this.client.query('SELECT 1')
  }

  /** NOTIFY on this session (it does not wait for a pool connection). */
  async notify(channel: string, payload: string): Promise<void> {
    await this.client.query('SELECT pg_notify($1, $2)', [channel, payload])
  }

  /** Drops the socket at once (a session that stopped answering cannot be ended politely). */
  destroy(): void {
    this.lost = true
    const stream = (this.client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream
    stream?.destroy()
  }

  /** Called once, when the session ends or fails: whatever it held is gone. */
  onLost(handler: (err: Error | undefined) => void): void {
    this.lostHandler = handler
  }

  get isLost(): boolean {
    return this.lost
  }

  /** Takes the leader lock if nobody holds it; never waits. */
  async tryLock(): Promise<boolean> {
    const { rows } = await this.client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [LEADER_LOCK_KEY])
    return rows[0]?.ok === true
  }

  /** Records this session as the leader, reachable at `url` (null: not reachable by the others). */
  async record(url: string | null): Promise<void> {
    await this.client.query(
      `INSERT INTO broker_leader (id, url, backend_pid, since) VALUES (1, $1, pg_backend_pid(), now())
       ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, backend_pid = EXCLUDED.backend_pid, since = EXCLUDED.since`, [url])
  }

  async listen(channels: string[]): Promise<void> {
    for (const channel of channels) await this.client.query(`LISTEN ${pg.escapeIdentifier(channel)}`)
  }

  /**
   * Ends the session: the lock and the LISTENs go with it. A polite end waits for the server, which
   * may never answer (a cut connection): after a second the socket is dropped instead.
   */
  async close(): Promise<void> {
    this.lost = true
    let timer: NodeJS.Timeout | undefined
    const gaveUp = new Promise<void>((resolve) => { timer = setTimeout(resolve, CLOSE_WAIT_MS) })
    await Promise.race([this.client.end().catch(() => {}), gaveUp])
    clearTimeout(timer)
    this.destroy()
  }
}

/** The leader's URL, if a live session holds the lock and recorded one. */
export async function leaderUrl(pool: pg.Pool): Promise<string | null> {
  const { rows } = await pool.query<{ url: string | null }>(
    `SELECT r.url FROM broker_leader r
     JOIN pg_locks l ON l.pid = r.backend_pid AND l.locktype = 'advisory' AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND ((l.classid::bigint << 32) | l.objid::bigint) = $1
     WHERE r.id = 1`, [LEADER_LOCK_KEY])
  return rows[0]?.url ?? null
}

/** NOTIFY on a channel (after the caller's commit: NOTIFY outside a transaction is sent at once). */
export async function publish(pool: pg.Pool, channel: string, payload: string): Promise<void> {
  await pool.query('SELECT pg_notify($1, $2)', [channel, payload])
}

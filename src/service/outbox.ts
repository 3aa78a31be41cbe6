/**
 * Transactional produce: moving what hookq_produce() wrote into the log.
 *
 * Design. An application calls hookq_produce() inside its own transaction on the broker's
 * database; the message must exist if and only if that transaction commits, get a dense offset
 * like any other, and never make another producer wait, whatever the caller does before its
 * COMMIT. Offsets are handed out under the partition row's lock, held until commit (that is what
 * keeps a partition's commits in offset order: see APPEND in src/store/messages.ts). Taking that
 * lock in the caller's transaction would hold every producer of the partition behind the slowest
 * caller. So the function takes no such lock: it checks its arguments and INSERTs a row into
 * produce_outbox, which nobody else waits on. The offset comes later:
 *
 * - An idle broker is woken by PostgreSQL: a trigger on produce_outbox NOTIFYs at the caller's
 *   commit (channel hookq_outbox, one per transaction however many calls), and each process LISTENs
 *   on its member session (src/store/membership.ts), so a message is moved within a round trip of
 *   its commit and an idle broker makes no statement for the outbox (polling every 50 ms cost an
 *   idle process ~21 commits a second). Only while a process waits: a transaction that NOTIFYs
 *   takes PostgreSQL's notification lock at commit and holds it through its WAL flush, so with a
 *   NOTIFY each, concurrent callers committed one at a time (8 callers: ~440 commits/s instead of
 *   ~1,750). A process about to wait takes the wait lock (OUTBOX_WAIT_KEY) on its session and looks
 *   once more; the trigger, at commit, tries it shared and NOTIFYs only when refused. A busy
 *   process gives it up and polls every 5 ms while it finds rows; a commit that skipped the NOTIFY
 *   held the lock shared until it was visible, so the process takes it only after, and its last
 *   look sees the row (the outbox_notify_when_idle migration).
 * - A slow poll remains as a backstop (HOOKQ_OUTBOX_POLL_MS, default 5 s with a member session):
 *   a notification is lost only while the session is down, and a session that joins again looks at
 *   once, so the poll covers what nothing else can foresee within seconds, at 0.2 statements a
 *   second: a notification missed between the session's loss and its rejoin, or a process that
 *   left the waiting to another which then died (its next poll takes the wait lock over). Without a member session (the embedded database, a pool of one) nothing is heard and
 *   the poll is the only way: it stays at 50 ms there. A process polls every 5 ms while its last
 *   look found rows, and a notification heard during a move makes another look right after it. N
 *   processes take turns polling: each idle one looks in its own slot of every N polls (slots by
 *   the wall clock, in the order of the members' ids), so the database sees one look per poll
 *   however many processes there are. A turn can be missed: a member hung but not yet dropped keeps
 *   its slot, and hosts whose clocks disagree by more than a poll look closer together than that; a
 *   row a notification did not announce then waits up to N polls, not one.
 * - A process that sees rows moves them in a short transaction of its own: DELETE ... RETURNING
 *   the oldest rows, idempotency keys settled against the log, APPEND, COMMIT (store/outbox.ts).
 *   Deleting and appending commit together, so a row is moved once and only once: a process killed
 *   midway leaves the transaction to roll back and the rows where they were, for the next mover.
 * - One mover at a time (a transaction-scoped advisory lock, try-locked: the others skip that
 *   round), oldest row first, so messages enter the log in the order their transactions made them
 *   visible: two transactions of which one committed before the other called the function keep
 *   that order in the log (and per key, in a partition).
 * - Rows carry no partition: the mover chooses it as HTTP produce does (the key's murmur2, else
 *   round robin), so a key's messages share a partition whichever way they came in, and
 *   idempotency keys deduplicate across both ways.
 * - Uncommitted rows are invisible to the mover, and rolled-back ones never become visible: a
 *   rollback leaves nothing but a used id of the outbox's sequence.
 */
import type { AppendEntry, Coordinates } from '../store/messages.ts'
import type { Database } from '../store/db.ts'
import {
  isRowFault,
  MoveFailed,
  moveOutbox,
  oldestWaitingId,
  outboxWaiting,
  setAsideOutboxRow,
  type Moved,
  type OutboxRow,
} from '../store/outbox.ts'
import type { ProduceService } from './produce.ts'
import { timerDelayMs } from '../core/timer-delay.ts'
import { traceOfHeaderText, type MessageTrace } from '../core/trace-context.ts'

export interface OutboxMoverOptions {
  db: Database
  produce: ProduceService
  /**
   * How often the processes, taking turns, look for rows when idle, ms (each one every N polls of N
   * processes): the backstop of notifications (wake), or the only way without them.
   */
  pollMs: number
  /** Rows one transaction moves at most. */
  batchRows: number
  /** Bytes (values, headers, keys) one transaction moves at most; a larger row moves alone. */
  batchBytes: number
  /** `n` messages were appended to topic `name`. */
  onMoved?(name: string, n: number): void
  /** Outbox row `id` could not be moved and was set aside (produce_outbox_set_aside). */
  onSetAside?(id: number): void
  /**
   * The wait lock (src/store/membership.ts OutboxWait): taken before this process waits idle, so
   * committers NOTIFY; given up while it moves rows, so they need not. Absent: nothing is heard.
   */
  waitLock?: { take(): Promise<'taken' | 'held' | 'elsewhere' | 'busy' | 'none'>; release(): Promise<void> }
  /** This process's turn among the processes polling (index from 0, of count); alone when absent. */
  turn?: () => { index: number; count: number }
  log: { warn(obj: object, msg: string): void; error(obj: object, msg: string): void }
}

/** How soon to look again after a look that found rows, ms. */
const BUSY_POLL_MS = 5

/**
 * When the process of turn `index` among `count` next looks, idle: the next start of its slot, the
 * slots being the wall clock's pollMs-long intervals, dealt to the processes in turn. Never sooner
 * than 1 ms from now (a look that just ended does not run again in the same slot).
 */
export function nextTurnMs(nowMs: number, pollMs: number, index: number, count: number): number {
  const period = pollMs * count
  const offset = pollMs * (index % count)
  let at = Math.floor((nowMs - offset) / period) * period + offset
  while (at < nowMs + 1) at += period
  return at
}

export class OutboxMover {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<unknown> | undefined
  private stopped = true
  private failing = false
  /** A wake came during a round: look again right after it. */
  private again = false
  /** After a batch failed for one of its rows: how many rows to move one at a time, to find it. */
  private singly = 0

  constructor(private readonly opts: OutboxMoverOptions) {}

  start(): void {
    if (!this.stopped) return
    this.stopped = false
    this.schedule(0)
  }

  /** Stops polling and waits for a move under way to commit or roll back. */
  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    this.timer = undefined
    await this.running
  }

  /** Rows were committed (a notification), or may have been unheard (the session joined again): look now. */
  wake(): void {
    void this.poke()
  }

  /** Looks for rows now (tests, notifications), or right after the round under way. */
  async poke(): Promise<void> {
    if (this.stopped) return
    if (this.running) {
      this.again = true
      await this.running
      return
    }
    clearTimeout(this.timer)
    this.running = this.round()
      .then((found) => this.nextLookMs(found))
      .then((ms) => {
        this.running = undefined
        this.again = false
        this.schedule(ms)
      })
    await this.running
  }

  /**
   * When to look next. Rows found: soon, and committers need not NOTIFY meanwhile (the wait lock is
   * given up). None: wait idle, holding the wait lock so that commits are told; a lock just taken
   * gets one more look, for what committed before it was taken without a NOTIFY. Committers holding
   * it shared (their commits under way): look again soon, and take it then.
   */
  private async nextLookMs(found: boolean): Promise<number> {
    const busy = Math.min(BUSY_POLL_MS, this.opts.pollMs)
    if (found) {
      await this.opts.waitLock?.release()
      return busy
    }
    if (this.again) return 0
    const wait = (await this.opts.waitLock?.take()) ?? 'none'
    if (wait === 'taken') return 0
    if (wait === 'busy') return busy
    return this.idleMs()
  }

  /** How long an idle process waits for its next look: to its next turn. */
  private idleMs(): number {
    const turn = this.opts.turn?.() ?? { index: 0, count: 1 }
    const count = Math.max(1, turn.count)
    if (count === 1) return this.opts.pollMs
    const now = Date.now()
    return nextTurnMs(now, this.opts.pollMs, turn.index, count) - now
  }

  private schedule(ms: number): void {
    if (this.stopped) return
    clearTimeout(this.timer)
    this.timer = setTimeout(() => {
      void this.poke()
    }, timerDelayMs(ms))
    this.timer.unref()
  }

  /**
   * Moves batches until the outbox is empty, another process is moving, or a batch fails. Never
   * rejects; resolves with whether rows were waiting (and were moved, here or by another process).
   */
  private async round(): Promise<boolean> {
    try {
      if (!(await outboxWaiting(this.opts.db.pool))) return false
      for (;;) {
        const rows = this.singly > 0 ? 1 : this.opts.batchRows
        let moved: Moved | null
        try {
          moved = await moveOutbox(this.opts.db, { rows, bytes: this.opts.batchBytes }, (row) => this.place(row))
        } catch (err) {
          if (!(err instanceof MoveFailed) || !isRowFault(err.cause)) throw err
          await this.isolate(err, rows)
          continue
        }
        if (!moved) return true
        this.singly = Math.max(0, this.singly - moved.rows.length)
        this.announce(moved)
        if (this.failing) this.opts.log.warn({}, 'moving the produce outbox works again')
        this.failing = false
        if ((moved.rows.length < rows && !moved.cut) || this.stopped) return true
      }
    } catch (err) {
      // The rows stay in the outbox (the move rolled back); the next poll tries again.
      const cause = err instanceof MoveFailed ? err.cause : err
      if (!this.failing) this.opts.log.error({ err: cause }, 'moving the produce outbox failed; retrying at the next poll')
      this.failing = true
      return false
    }
  }

  /**
   * A move failed for something in its rows. A batch is then moved again one row at a time, so that
   * only the row at fault stays behind; a row that fails alone is set aside, whole, with the reason
   * (produce_outbox_set_aside), and reported by its outbox id, never its value. Retrying it in place
   * would hold every later row of every producer behind it for ever.
   */
  private async isolate(err: MoveFailed, triedRows: number): Promise<void> {
    const reason = describe(err.cause)
    // Failed with more than one row taken, or before it knew which it took: one at a time.
    if (err.ids.length > 1 || (err.ids.length === 0 && triedRows > 1)) {
      this.singly = Math.max(1, err.ids.length)
      this.opts.log.warn(
        { rows: err.ids.length, outboxIds: err.ids.length > 0 ? [err.ids[0], err.ids.at(-1)] : undefined, reason },
        'moving a batch of the produce outbox failed; moving its rows one at a time',
      )
      return
    }
    const id = err.ids[0] ?? (await oldestWaitingId(this.opts.db.pool))
    if (id === null) return
    if (await setAsideOutboxRow(this.opts.db.pool, id, reason)) {
      this.opts.log.error(
        { outboxId: id, reason },
        'set aside a produce outbox row that cannot be moved into its topic (see produce_outbox_set_aside); the rows behind it move on',
      )
      this.opts.onSetAside?.(id)
    }
    this.singly = Math.max(0, this.singly - 1)
  }

  /** A row's entry in the log: its partition chosen, its trace read from its headers (hookq_produce takes it there). */
  private place(row: OutboxRow): AppendEntry | null {
    if (!row.topic) return null
    const trace: MessageTrace = { traceId: '', traceparent: null, tracestate: null }
    traceOfHeaderText(row.headers, trace)
    return {
      topicId: row.topicId,
      partition: this.opts.produce.partitionFor(row.topicId, row.topic.partitions, row.key),
      key: row.key,
      value: row.value,
      headers: row.headers,
      delayMs: row.delayMs,
      idempotencyKey: row.idempotencyKey,
      traceId: trace.traceId,
      traceparent: trace.traceparent,
      tracestate: trace.tracestate,
    }
  }

  /** Wakes the dispatchers (this process's directly, the others through the cluster), as HTTP produce does. */
  private announce({ rows, entries, coordinates }: Moved): void {
    const byTopic = new Map<number, { name: string; entries: AppendEntry[]; coordinates: Coordinates[] }>()
    let dropped = 0
    rows.forEach((row, i) => {
      const e = entries[i]
      const c = coordinates[i]
      if (!e || !c || !row.topic) {
        dropped++
        return
      }
      let t = byTopic.get(row.topicId)
      if (!t) byTopic.set(row.topicId, (t = { name: row.topic.name, entries: [], coordinates: [] }))
      t.entries.push(e)
      t.coordinates.push(c)
    })
    if (dropped > 0) this.opts.log.warn({ dropped }, 'dropped produce outbox rows whose topic was deleted')
    for (const [topicId, t] of byTopic) {
      this.opts.produce.notify(topicId, t.entries, t.coordinates)
      this.opts.onMoved?.(t.name, t.coordinates.filter((c) => !c.duplicate).length)
    }
  }
}

/** An error as a short line for the set-aside row and the log: its SQLSTATE or name, and message. */
function describe(err: unknown): string {
  const { code, name, message } = (err ?? {}) as { code?: unknown; name?: unknown; message?: unknown }
  const what = typeof code === 'string' ? code : typeof name === 'string' ? name : 'Error'
  return `${what}: ${typeof message === 'string' ? message : String(err)}`
}

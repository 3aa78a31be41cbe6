/**
 * The partitions' progress in PostgreSQL, written by one writer per dispatcher: completions (acks
 * and dead letters) and push reservations of every partition this process owns go out together,
 * one statement per flush (src/store/consumption.ts writeProgress), each partition fenced by the
 * owner epoch this process holds for it.
 *
 * One writer, not two: with a writer each, completions and reservations locked the same
 * group_offsets rows in opposite orders; PostgreSQL broke the deadlocks by failing one statement,
 * and a completion lost that way pushed an acked message again.
 *
 * Jobs queued by the end of the current turn of the event loop go in the next statement
 * (setImmediate); while a statement runs, the next batch gathers. Callbacks, not a promise per job:
 * a job costs one array slot until its statement returns.
 *
 * When to write (`linger`), as PostgreSQL's commit_delay waits only when others are active:
 * - A busy writer (its last statement had at least minJobs / N jobs, N = `processes`) starts the
 *   next no sooner than `ms` after the last one started, while the CPU is busy (cpu-load.ts).
 *   Otherwise N processes sharing a load write N times the statements of one. The wait is `ms`, not
 *   N × ms: a message waits for its reservation's statement while it holds a maxInFlight slot (its
 *   completion's no longer: push-flow.ts), so the wait bounds a partition's rate. With CPU to spare
 *   a full writer waits as a quiet one does: statements saved pay only when CPU runs out, and the
 *   wait costs the slots held meanwhile. One statement runs at a time either way, so what queues
 *   while one runs still goes in the next.
 * - A quiet writer never waits when alone: a lone message's reservation, hence its push, is not
 *   held up (a wait on every statement took the p50 latency at 500 msg/s from 2 to 32 ms). A quiet
 *   writer of N processes starts its next statement no sooner than N times the last one's time
 *   after it started (at most `ms`), so together they write about what one would: that spares
 *   PostgreSQL, which may be on another host, where this process cannot see its CPU.
 * - An ordered partition's jobs never wait: its next message waits for this one's completion, so a
 *   wait would delay pushes, not gather company. Key-ordered and unordered partitions wait, full or not.
 * - Nor does the reservation of a partition with nothing out with its consumer (no message pushed
 *   and unanswered or unacked, none being completed): its first pushes wait on it and nothing of
 *   the partition is moving meanwhile, so a wait would only hold them up (a message produced to an
 *   idle partition after a busy spell waited up to the whole linger for its push). A partition with
 *   messages out keeps the wait, explicit-ack groups included (a push answered but not yet acked is
 *   still out): its reservation gathers company while they run.
 * - A quiet writer's statement of lazy completions alone (auto acks of unordered push partitions,
 *   and filtered messages: no slot or key waits on them, and nothing reads their durability but a
 *   restart) waits `lazyMs` for company, cut short by any other job. At 500 single-message calls a
 *   second each completion was a statement, a commit and two wake-ups of its own (docs/performance.md).
 * - Nor do a pull group's jobs: a caller waits on each of them (its answer on the reservation, its
 *   ack call on the completion) and sends nothing more meanwhile, so a wait adds to every caller's
 *   cycle and gathers no company: 8 callers acking 100 each made the writer busy, and pull + ack
 *   ran at one statement per 20 ms wait. Callers still share a statement: what queues while one
 *   runs goes in the next.
 * (figures: docs/performance.md#the-progress-writer)
 */
import { HookqError } from '../core/errors.ts'
import type { Database } from '../store/db.ts'
import { writeProgress, type PartitionWrite, type ProgressBatch, type ProgressResult } from '../store/consumption.ts'
import { nodeTimers, type Timers } from './schedule.ts'
import type { CompletionRequest, CompletionStatus, GroupRuntime, PartitionState } from './partition-state.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

interface CompletionJob {
  req: CompletionRequest
  done(status: CompletionStatus): void
  fail(err: unknown): void
}

interface ReservationJob {
  g: GroupRuntime
  w: PartitionState
  /**
   * First pushes below this may go out; null for a check of the fence alone (a retry). Not the
   * reservation as it stood when queued: a give-back may lower it meanwhile (stalled-reservations.ts),
   * and a check carrying the old value would raise it again.
   */
  pushedOffset: number | null
  /** True when the partition's epoch is still this process's: the pushes may go out. */
  done(held: boolean): void
  fail(err: unknown): void
}

export interface ProgressWriterDeps {
  db: Database
  /** A write for the partition was refused for its epoch: it is not this process's any more. */
  onRefused(g: GroupRuntime, w: PartitionState): void
  /** Dead letters were appended up to `endOffset` (exclusive) of a topic's partition. */
  onAppended(topicId: number, partition: number, endOffset: number): void
  /** Tests replace the statement (to fail it, or to watch what is written). */
  write?: (db: Database, batch: ProgressBatch) => Promise<ProgressResult>
  /** A busy writer's wait for company (see above); none when absent. */
  linger?: Linger
  /** Whether the CPU is busy (cpu-load.ts): a full writer waits for company only then. Always, when absent. */
  cpuBusy?: () => boolean
  /** The broker processes sharing the partitions, this one included (1 when alone or absent). */
  processes?: () => number
  /** How long a statement of lazy completions alone waits for company, ms (see below); none when absent. */
  lazyMs?: number
  now?: () => number
  timers?: Timers
}

export interface Linger {
  /** The least time from one statement's start to the next's when busy, ms; the most a quiet writer of several processes waits. */
  ms: number
  /** Jobs in a statement that make a process alone busy (one of N processes: a Nth of it): the next one waits. */
  minJobs: number
}

/** The broker's linger: 20 ms is a tenth of an auto-mode push's cycle under full load, where it applies. */
export const DEFAULT_LINGER: Linger = { ms: 20, minJobs: 64 }

/** The broker's lazyMs: about the attempt log's own wait, so at low rates the two write together as often. */
export const LAZY_COMPLETION_MS = 10

export class ProgressWriter {
  private completions: CompletionJob[] = []
  private reservations: ReservationJob[] = []
  private scheduled = false
  private running: Promise<void> | undefined
  private closed = false
  /** When the last statement started, and how long the next waits from then (set once it returned; 0: no wait). */
  private lastStartMs = -Infinity
  private lingerMs = 0
  /** How long the last statement took in the database (the wait of a quiet writer of several processes). */
  private statementMs = 0
  /** The timer of the wait under way, if any (settled() and an ordered partition's job cut it short). */
  private lingerTimer: unknown
  /** A job queued for the next statement holds up its partition (an ordered one): that statement does not wait. */
  private urgent = false
  /** A job queued for the next statement that something waits on (all but lazy completions). */
  private eager = false
  /** The wait under way is a lazy one (cut short by an eager job). */
  private lazyWait = false
  private readonly write: (db: Database, batch: ProgressBatch) => Promise<ProgressResult>
  private readonly now: () => number
  private readonly timers: Timers

  constructor(private readonly deps: ProgressWriterDeps) {
    this.write = deps.write ?? writeProgress
    this.now = deps.now ?? Date.now
    this.timers = deps.timers ?? nodeTimers
  }

  /**
   * Completes a message: `done` gets its status once durable (or known not to need writing), `fail`
   * the error if the write failed. `lazy`: nothing waits on it (see lazyMs).
   */
  complete(req: CompletionRequest, done: (status: CompletionStatus) => void, fail: (err: unknown) => void, lazy = false): void {
    if (this.closed) return fail(closedError())
    this.completions.push({ req, done, fail })
    this.queued(req.g, false, lazy)
  }

  /** Completes the messages together (queued in one turn, so written in one statement): their statuses once durable. */
  completeAll(reqs: CompletionRequest[]): Promise<CompletionStatus[]> {
    if (reqs.length === 0) return Promise.resolve([])
    return new Promise((resolve, reject) => {
      const statuses = new Array<CompletionStatus>(reqs.length)
      let waiting = reqs.length
      let failed = false
      reqs.forEach((req, k) => {
        this.complete(
          req,
          (status) => {
            statuses[k] = status
            if (--waiting === 0 && !failed) resolve(statuses)
          },
          (err) => {
            if (!failed) {
              failed = true
              reject(err)
            }
          },
        )
      })
    })
  }

  /** Records a push reservation (or, null, checks the fence only): `done(held)` once written. */
  reserve(
    g: GroupRuntime,
    w: PartitionState,
    pushedOffset: number | null,
    done: (held: boolean) => void,
    fail: (err: unknown) => void,
  ): void {
    if (this.closed) return fail(closedError())
    this.reservations.push({ g, w, pushedOffset, done, fail })
    this.queued(g, !w.engaged())
  }

  /**
   * A job of the group was queued: schedules the statement, at the end of this turn if a push or a
   * caller waits on it alone (an ordered partition's job, a pull group's, or `idle`: a reservation of
   * a partition with nothing out with its consumer, see Partition.engaged).
   */
  private queued(g: GroupRuntime, idle = false, lazy = false): void {
    // A job something waits on ends a wait for lazy completions' company; an urgent one any wait.
    const endsLazyWait = !lazy && this.lazyWait
    if (!lazy) this.eager = true
    const urgent = !this.urgent && (idle || g.row.ordering === 'partition' || g.row.delivery === 'pull')
    if (urgent) this.urgent = true
    if ((urgent || endsLazyWait) && this.lingerTimer !== undefined) {
      this.timers.clearTimeout(this.lingerTimer)
      this.lingerTimer = undefined
      this.lazyWait = false
      setImmediate(() => this.start())
      return
    }
    this.schedule()
  }

  /** Resolves once everything queued so far (and meanwhile) is written or failed. */
  async settled(): Promise<void> {
    while (this.running || this.scheduled || this.completions.length > 0 || this.reservations.length > 0) {
      if (this.lingerTimer !== undefined) this.start()
      if (!this.running && !this.scheduled) this.schedule()
      await (this.running ?? new Promise<void>((resolve) => setImmediate(resolve)))
    }
  }

  /** Takes no more jobs and resolves once the queued ones are written (shutdown). */
  async drain(): Promise<void> {
    await this.settled()
    this.closed = true
  }

  private schedule(): void {
    if (this.scheduled || this.running) return
    this.scheduled = true
    let wait = this.lingerMs > 0 && !this.urgent ? this.lastStartMs + this.lingerMs - this.now() : 0
    this.lazyWait = wait <= 0 && !this.eager && !this.urgent && (this.deps.lazyMs ?? 0) > 0
    if (this.lazyWait) wait = this.deps.lazyMs!
    if (wait > 0) this.lingerTimer = this.timers.setTimeout(() => this.start(), timerDelayMs(wait))
    else setImmediate(() => this.start())
  }

  /** Writes what is queued now: at the end of the turn, at the end of a wait, or when settled() cuts a wait short. */
  private start(): void {
    if (!this.scheduled) return
    if (this.lingerTimer !== undefined) {
      this.timers.clearTimeout(this.lingerTimer)
      this.lingerTimer = undefined
    }
    this.scheduled = false
    this.lastStartMs = this.now()
    const jobs = this.completions.length + this.reservations.length
    // (A statement of lazy completions gathered them on purpose: its size says nothing of the load.)
    const full = !this.lazyWait && this.deps.linger !== undefined && jobs * this.processes() >= this.deps.linger.minJobs
    this.lingerMs = 0
    this.urgent = false
    this.eager = false
    this.lazyWait = false
    this.running = this.flush().finally(() => {
      this.running = undefined
      this.lingerMs = this.nextWaitMs(full, this.statementMs)
      if (this.completions.length > 0 || this.reservations.length > 0) this.schedule()
    })
  }

  /**
   * How long the next statement waits from the last one's start, given how long that one took: a
   * full writer's linger while the CPU is busy (read now, as the wait is decided; always busy when
   * no gauge is given); else, with N processes, N times the last statement's time (capped by the
   * linger), so that N quiet writers together write about as often as one would (each of one
   * process's statements is written as soon as the last returns); else no wait.
   */
  private nextWaitMs(full: boolean, tookMs: number): number {
    const linger = this.deps.linger
    if (!linger) return 0
    if (full && (this.deps.cpuBusy?.() ?? true)) return linger.ms
    const n = this.processes()
    return n > 1 ? Math.min(linger.ms, n * tookMs) : 0
  }

  private processes(): number {
    return Math.max(1, this.deps.processes?.() ?? 1)
  }

  private async flush(): Promise<void> {
    const jobs = this.completions
    const reservations = this.reservations
    this.completions = []
    this.reservations = []
    const statuses: CompletionStatus[] = new Array<CompletionStatus>(jobs.length)
    const marked: number[] = []
    for (let i = 0; i < jobs.length; i++) {
      const r = jobs[i]!.req
      // Not this process's partition any more (handed over, claimed again after a seek): ask its owner.
      if (r.w.dropped) statuses[i] = 'moved'
      else if (!r.w.markCompleted(r.offset)) statuses[i] = 'already_completed'
      else {
        marked.push(i)
        statuses[i] = r.outcome
      }
    }
    // One entry per partition written: where its committed offset moves, and its reservation.
    const parts = new Map<PartitionState, { g: GroupRuntime; write: PartitionWrite }>()
    const part = (g: GroupRuntime, w: PartitionState) => {
      let p = parts.get(w)
      if (!p) {
        p = {
          g,
          write: {
            groupId: g.row.id,
            topicId: g.topic.id,
            partition: w.partition,
            ownerEpoch: w.ownerEpoch,
            committedOffset: null,
            pushedOffset: null,
            filtered: 0,
          },
        }
        parts.set(w, p)
      }
      return p
    }
    for (const i of marked) {
      const { g, w, outcome } = jobs[i]!.req
      const p = part(g, w)
      if (outcome === 'filtered') p.write.filtered++
      if (p.write.committedOffset === null) {
        const to = w.nextIncomplete()
        if (to > w.committed) p.write.committedOffset = to
      }
    }
    const live = reservations.filter((r) => !r.w.dropped)
    for (const r of live) {
      const p = part(r.g, r.w)
      if (r.pushedOffset !== null && r.pushedOffset > r.w.reservedTo && r.pushedOffset > (p.write.pushedOffset ?? -1))
        p.write.pushedOffset = r.pushedOffset
    }
    const batch: ProgressBatch = { partitions: [...parts.values()].map((p) => p.write), completions: [], deadLetters: [] }
    for (const i of marked) {
      const { g, w, offset, deadLetter } = jobs[i]!.req
      const to = parts.get(w)!.write.committedOffset ?? w.committed
      if (offset >= to) batch.completions.push({ groupId: g.row.id, topicId: g.topic.id, partition: w.partition, offset })
      if (deadLetter)
        batch.deadLetters.push({ from: { groupId: g.row.id, topicId: g.topic.id, partition: w.partition }, entry: deadLetter })
    }
    let result: ProgressResult
    const sentMs = this.now()
    try {
      result = await this.write(this.deps.db, batch)
    } catch (err) {
      for (const i of marked) jobs[i]!.req.w.unmarkCompleted(jobs[i]!.req.offset)
      for (const j of jobs) j.fail(err)
      for (const r of reservations) r.fail(err)
      return
    } finally {
      this.statementMs = this.now() - sentMs
    }
    const refused = new Set<PartitionState>()
    for (const [w, p] of parts) {
      if (result.refused.some((k) => k.groupId === p.write.groupId && k.topicId === p.write.topicId && k.partition === p.write.partition))
        refused.add(w)
    }
    // Partitions whose epoch moved on wrote nothing: their requests are the new owner's to answer.
    for (const i of marked) {
      const r = jobs[i]!.req
      if (!refused.has(r.w)) continue
      r.w.unmarkCompleted(r.offset)
      statuses[i] = 'moved'
    }
    for (const [w, p] of parts) {
      if (refused.has(w)) {
        this.deps.onRefused(p.g, w)
        continue
      }
      w.advance(p.write.committedOffset, p.write.pushedOffset)
    }
    // Dead letters are appended here, not by produce: wake the groups reading their topics.
    for (const d of result.deadLettered) this.deps.onAppended(d.topicId, d.partition, d.offset + 1)
    for (let i = 0; i < jobs.length; i++) jobs[i]!.done(statuses[i]!)
    for (const r of reservations) r.done(!r.w.dropped && !refused.has(r.w))
  }
}

function closedError(): HookqError {
  return new HookqError('unavailable', 'the broker is shutting down', { retryAfterS: 1 })
}

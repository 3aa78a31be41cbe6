/**
 * The way of a message through its pushes, for the partitions this process owns: the pushes (their
 * HTTP side: push-send.ts), the writes and the schedule. Which moves a message may make is src/dispatch/partition.ts's (its
 * table is enforced there: this file only asks); what makes each one is here:
 *
 *   fill, admit   (new) → parked, then delayed (its delay) / in_flight (a push handed over in flight, adopted)
 *                 / retry_wait (one nacked while handed over) / ready / start
 *   start         → parked (no consumer, paused) / ready (window full) / reserving (past the reservation)
 *                   / in_flight (an attempt begins) / completing (filtered out; dead after a restart)
 *   settle        in_flight → completing (2xx, auto mode) / retry_wait (failed: the backoff) / completing (dead letter)
 *   due           delayed → parked → ready or start; retry_wait → start; in_flight → retry_wait / completing (ack deadline)
 *   nack          in_flight → retry_wait / completing, or → nacked until its push is answered (then the same)
 *   ack           any → completing (ack-handler.ts)
 *   completed     completing → gone (durable); completionFailed, a dead letter not written: completing → retry_wait
 *
 * Invariant: every push attempt ends in exactly one outcome (acked, failed, timed_out, nacked or
 * dead) and has exactly one attempt row, written once its outcome is known (or as in_flight if
 * that takes long, then updated; see attempt-log.ts). The one exception to "written once": the
 * attempt after which its message is dead-lettered ends failed, timed_out or nacked, and its row is
 * then marked dead; its finish time, status code and error stay those of the attempt.
 *
 * - `fill` admits messages from the partition's buffer while the partition has room (maxInFlight
 *   active; one outstanding of any state when ordered) and the consumer's push window too. A
 *   message being completed holds no slot (Partition.active): its consumer is done with it, and its
 *   completion is written while the next messages go out, in the same statement as their reservation.
 * - A reservation covers the messages one pass admitted (a batch of freed slots), and no more than
 *   the consumer's window or the pull callers' room could take (Transport.reservable). For a
 *   partition idle here, the append of its next messages writes their reservation in its own
 *   statement: they go out on the produce's commit, with no second one before the push. When a
 *   reservation is written and how much it covers is reservations.ts's.
 * - A first push goes out only below the partition's reservation (group_offsets.pushed_offset), a
 *   retry only once its attempt row is written and the owner epoch checked: a crash can never make
 *   the next owner push a message as attempt 1 again, and a process that lost the partition pushes
 *   nothing more for it. (Not yet: a reservation may pass a message not pushed yet, delayed or
 *   behind its key, which a crash then counts as attempted; see docs/performance.md.)
 * - A partition that can push nothing for now (its group paused, its consumer gone) gives back
 *   what it reserved and never pushed (stalled-reservations.ts): an append may have reserved its
 *   messages before the pause, and they would otherwise count as attempted after a crash.
 * - An attempt counts once its push is given a connection (push-send.ts asks at that moment, and
 *   again proves the ownership lease: a push may wait in the HTTP client's queue). One begun but
 *   not sent when this ownership ends (the process stopping, the partition handed over or lost)
 *   was never an attempt: it does not go, and the handover deletes its row and gives back its
 *   reservation, so the next owner pushes that number (Partition.unsent, firstUnpushed).
 * - Completions (auto acks, acks, dead letters) are written by the progress writer; `completed`
 *   then forgets the message.
 */
import type { ConsumerRow } from '../store/groups.ts'
import type { DispatchMessage } from '../core/dispatch-message.ts'
import type { Database } from '../store/db.ts'
import type { TopicRow } from '../store/topics.ts'
import { newDeliveryId } from '../core/delivery-id.ts'
import type { AttemptStart } from '../store/deliveries.ts'
import type { DispatchMetrics } from '../metrics.ts'
import type { AttemptLog } from './attempt-log.ts'
import { assignPartitions } from '../core/consumer-assignment.ts'
import type { ConsumerWindows } from './consumer-windows.ts'
import { READ_AHEAD, type PartitionReader } from './partition-reader.ts'
import type { ProgressWriter } from './progress.ts'
import type { PushAgent, PushResult } from './pusher.ts'
import { errorOf, PushSender, type PushLease } from './push-send.ts'
import { leaseAttempt, recordDeadLetter } from './tracing.ts'
import { honourRetryAfterMs, nextDelayMs } from '../core/retry-policy.ts'
import type { Schedule, Timers } from './schedule.ts'
import type { TrackerEntry } from './tracker.ts'
import { Wait } from './waits.ts'
import type { HealthRecorder } from './health.ts'
import { deadLetterEntry, type CompletionRequest, type GroupRuntime, type Outstanding, type PartitionState } from './partition-state.ts'
import type { Attempt } from './partition.ts'
import { buildEnvelope } from './envelope.ts'
import { Reservations } from './reservations.ts'
import { StalledReservations } from './stalled-reservations.ts'
import type { PullDesk } from './pull-desk.ts'

/** Delayed messages held per partition at most (beyond maxInFlight); later ones wait in the log. */
const MAX_DELAYED = 1000
/** Messages held per partition behind their keys' outstanding ones (ordering "key") at most; later ones wait in the log. */
const MAX_KEY_QUEUED = 10_000

export interface PushFlowDeps {
  db: Database
  findTopic(name: string): Promise<TopicRow | null>
  attempts: AttemptLog
  agent: PushAgent
  log: { error(obj: object, msg: string): void }
  metrics?: DispatchMetrics
  now(): number
  timers: Timers
  schedule: Schedule
  windows: ConsumerWindows
  progress: ProgressWriter
  reader: PartitionReader
  /** The runtime of a group loaded here, by id. */
  group(groupId: number): GroupRuntime | undefined
  /** True once the dispatcher is stopping: nothing new goes out. */
  stopped(): boolean
  /** Whether this process still owns what it pushes (push-send.ts PushLease). */
  lease?: PushLease
  /** Records a consumer of the group as disabled (410 Gone) at `at`. */
  disableConsumer(groupId: number, id: string, reason: string, at: Date): Promise<void>
  /** A write for the partition was refused for its owner epoch: it is not this process's any more. */
  moved(g: GroupRuntime, w: PartitionState): void
  /** Each consumer's successes and failures, for its health. */
  health?: HealthRecorder
  /** The callers of pull groups waiting here (a lease goes to them instead of a push). */
  pulls: PullDesk
}

/**
 * How an attempt goes out: a push to a consumer or a lease to a caller of pull (PushFlow.start).
 * `take` claims its slot when the attempt begins; `send` hands it over; `giveBack` returns the slot
 * of an attempt that will not go (a retry whose record or fence failed).
 */
interface Transport {
  /** How long the attempt's ack deadline runs: the group's ackTimeoutMs, or the caller's leaseMs. */
  leaseMs: number
  /**
   * Whether `o` may have room beyond what the messages already waiting for a reservation were
   * promised: a reservation may cover it too, or (a retry) it may take that room now. The messages
   * a reservation covers should all go out when it is written.
   */
  reservable(o: Outstanding): boolean
  take(): void
  send(o: Outstanding, a: Attempt, deadlineMs: number, nowMs: number): void
  giveBack(): void
}

export class PushFlow {
  private readonly sender: PushSender
  /** Partitions waiting for the ownership lease to be proven again (leaseHeld): filled then. */
  private readonly leaseWaits = new Set<PartitionState>()
  /** Per pull group, the partition the next caller starts at (pullerCame). */
  private readonly pullTurns = new Map<number, number>()
  /** Gives back what a partition reserved and can no longer push (paused, its consumer gone). */
  private readonly stalled: StalledReservations
  /** When first pushes are reserved, and how many (reservations.ts); the dispatcher asks it of appends. */
  readonly reservations: Reservations

  constructor(private readonly deps: PushFlowDeps) {
    this.sender = new PushSender({
      agent: deps.agent,
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
      ...(deps.health ? { health: deps.health } : {}),
      now: deps.now,
      timers: deps.timers,
      windows: deps.windows,
      stopped: deps.stopped,
      ...(deps.lease ? { lease: deps.lease } : {}),
      answered: (g, w, o, a, consumer, r) => this.settleAttempt(g, w, o, a, consumer, r),
      safely: (fn) => this.safely(fn),
    })
    this.reservations = new Reservations({
      progress: deps.progress,
      windows: deps.windows,
      pulls: deps.pulls,
      ...(deps.lease ? { lease: deps.lease } : {}),
      log: deps.log,
      timers: deps.timers,
      stopped: () => deps.stopped(),
      moved: (g, w) => deps.moved(g, w),
      isOpen: (w, consumer) => this.sender.isOpen(w, consumer),
      fill: (g, w) => this.fill(g, w),
      start: (g, w, o) => this.start(g, w, o),
      safely: (fn) => this.safely(fn),
    })
    this.stalled = new StalledReservations({
      db: deps.db,
      attempts: deps.attempts,
      log: deps.log,
      timers: deps.timers,
      stalled: (g, w) => g.row.paused || (g.row.delivery === 'push' && !g.consumerOf[w.partition]),
      resume: (g, w) => this.safely(() => this.reservations.reserved(g, w)),
    })
  }

  // ---- admission ----

  /** Admits what may go out now: messages that fell due while there was no room, then the buffer's. */
  fill(g: GroupRuntime, w: PartitionState): void {
    if (g.row.delivery === 'pull') {
      this.fillPull(g, w)
      // Callers of pull with waitMs 0 answer once this pass (and any read or write it began) is over.
      return this.deps.pulls.settled(g.row.id)
    }
    if (this.deps.stopped() || g.dropped || w.dropped || w.releasing) return
    // Nothing to push to: read nothing (a consumer joining, or unpausing, calls fill again).
    const consumer = g.consumerOf[w.partition]
    if (g.row.paused || !consumer) return this.stalled.check(g, w)
    const ordering = g.row.ordering
    const limit = ordering === 'partition' ? 1 : g.row.maxInFlight
    const windows = this.deps.windows
    const win = windows.of(consumer.id)
    // (Each message checks the ownership lease first: start would leave it ready, and the loops spin.)
    while (w.ready.length > 0 && w.mayGo(limit, ordering === 'partition', true)) {
      if (!this.leaseHeld(g, w)) return
      const joining = this.sender.isOpen(w, consumer)
      if (!windows.hasRoom(win, joining)) return windows.wait(win, consumer.id, g, w, joining)
      const o = w.ready[0]!
      this.start(g, w, o)
      // Still ready: the window's room is promised to the reservation under way, whose end fills again.
      if (o.state === 'ready') return
    }
    const nowMs = this.deps.now()
    const byKey = ordering === 'key'
    while (w.mayGo(limit, ordering === 'partition') && w.delayed < MAX_DELAYED) {
      if (!this.leaseHeld(g, w)) return
      const joining = this.sender.isOpen(w, consumer)
      if (!windows.hasRoom(win, joining)) return windows.wait(win, consumer.id, g, w, joining)
      const next = w.buffer[0]
      if (!next) return this.deps.reader.read(g, w)
      // Keys that hold many messages back: read no further until some complete (memory stays bounded).
      if (byKey && w.keyQueued() >= MAX_KEY_QUEUED && next.key !== null && w.keyBusy(next.key)) return
      const msg = w.take()
      if (!msg) continue // read twice, or completed already
      // The filter, once per message: now for one that may go now, when its delay ends otherwise
      // (the filter may change meanwhile). One pushed before a restart goes on being pushed.
      const due = msg.availableAtMs <= nowMs
      if (due && g.filter && !w.pushedBefore(msg.offset) && !g.filter(msg)) {
        this.filterOut(g, w, msg.offset)
        continue
      }
      if (byKey && !w.takeKey(msg)) continue // waits behind its key's outstanding message
      this.admit(g, w, msg, due, nowMs)
      // It waits for room (ready counts in no limit): admit no more until it has gone.
      if (w.ready.length > 0) return
    }
    if (w.buffer.length < READ_AHEAD) this.deps.reader.read(g, w)
  }

  /**
   * fill for a pull group: the same admission, with the callers waiting here in place of a
   * consumer and its push window (nothing is read while nobody waits).
   */
  private fillPull(g: GroupRuntime, w: PartitionState): void {
    if (this.deps.stopped() || g.dropped || w.dropped || w.releasing) return
    if (g.row.paused) return this.stalled.check(g, w)
    const pulls = this.deps.pulls
    const id = g.row.id
    const ordering = g.row.ordering
    const limit = ordering === 'partition' ? 1 : g.row.maxInFlight
    while (w.ready.length > 0 && w.mayGo(limit, ordering === 'partition', true)) {
      if (!this.leaseHeld(g, w)) return
      // Nobody with room: a probe waiting is told that this one could go.
      if (!pulls.taker(id)) return pulls.leasable(id)
      const o = w.ready[0]!
      this.start(g, w, o)
      if (o.state === 'ready') return // the callers' room is spoken for by reservations under way
    }
    const nowMs = this.deps.now()
    const byKey = ordering === 'key'
    while (w.mayGo(limit, ordering === 'partition') && w.delayed < MAX_DELAYED) {
      if (!this.leaseHeld(g, w)) return
      const next = w.buffer[0]
      if (!next) return pulls.wanted(id) ? this.deps.reader.read(g, w) : undefined
      if (byKey && w.keyQueued() >= MAX_KEY_QUEUED && next.key !== null && w.keyBusy(next.key)) return
      // (The message may turn out delayed or filtered out: a probe told so is asked again.)
      if (!pulls.taker(id)) return pulls.leasable(id)
      if (this.reservations.roomBeyondReservations(g) <= 0) return
      const msg = w.take()
      if (!msg) continue
      const due = msg.availableAtMs <= nowMs
      if (due && g.filter && !w.pushedBefore(msg.offset) && !g.filter(msg)) {
        this.filterOut(g, w, msg.offset)
        continue
      }
      if (byKey && !w.takeKey(msg)) continue
      this.admit(g, w, msg, due, nowMs)
    }
    if (w.buffer.length < READ_AHEAD) this.deps.reader.read(g, w)
  }

  /** A caller of pull came for the group: what waits for one (ready, parked) goes out, then new messages. */
  pullerCame(g: GroupRuntime): void {
    // Each caller starts at the next partition: in one fixed order, a backlog on the first
    // partitions would fill every answer and the others wait until it drained.
    const parts = [...g.parts.values()]
    const turn = this.pullTurns.get(g.row.id) ?? 0
    this.pullTurns.set(g.row.id, (turn + 1) % Math.max(1, parts.length))
    for (let k = 0; k < parts.length; k++) {
      const w = parts[(turn + k) % parts.length]!
      if (!g.row.paused) for (const o of [...w.outstanding.values()]) if (o.state === 'parked') this.start(g, w, o)
      this.fill(g, w)
    }
  }

  /**
   * The group's ordering changed. To "key": the messages already out hold their keys (later ones
   * of those keys wait for all of them). From "key": the messages waiting behind their keys are
   * outstanding now, in offset order, ready to go as the new ordering and maxInFlight allow.
   */
  orderingChanged(g: GroupRuntime, previous: GroupRuntime['row']['ordering']): void {
    const nowMs = this.deps.now()
    for (const w of g.parts.values()) {
      if (g.row.ordering === 'key') w.holdKeys()
      else if (previous === 'key') for (const msg of w.drainKeys()) this.admit(g, w, msg, false, nowMs, true)
      this.fill(g, w)
    }
  }

  /**
   * Makes a message outstanding: it waits for its delay, or starts (or, `ready`, waits for room
   * like a message that fell due). `matched`: the filter was checked.
   */
  private admit(g: GroupRuntime, w: PartitionState, msg: DispatchMessage, matched: boolean, nowMs: number, ready = false): void {
    const { o, handed } = w.admit(msg, matched)
    const adopted = handed?.inFlight
    if (adopted !== undefined && adopted.attempt === o.attempts && o.attempts > 0) {
      // The previous owner's push, answered and awaiting its ack (a graceful handover): this
      // process's attempt in flight now, with its deadline, so the consumer's ack, nack or extend
      // of it is applied here and its deadline passing is a timeout like any other.
      const a = w.adopt(o, adopted.id, adopted.attempt, adopted.consumerId)
      w.setDeadline(o, a, this.deps.schedule.ackDeadline(a.id, g.row.id, w.partition, msg.offset, a.number, handed!.untilMs))
    }
    // Nacked while nobody held the partition (or an older attempt handed over): not again before then.
    else if (handed !== undefined && o.attempts > 0 && handed.untilMs > nowMs) this.wait(g, w, o, 'retry', handed.untilMs)
    else if (msg.availableAtMs > nowMs) this.wait(g, w, o, 'delay', msg.availableAtMs)
    else if (ready) w.move(o, 'ready')
    else this.start(g, w, o)
  }

  /**
   * A message is no longer outstanding (completed, or filtered out before its first push). In
   * ordering "key" its key goes to the key's next message, admitted now: a queued message was
   * admitted in offset order already, so it does not wait for room in the partition.
   */
  private forget(g: GroupRuntime, w: PartitionState, o: Outstanding): void {
    const next = w.forget(o, g.row.ordering === 'key')
    // Checked by the filter when it starts (it may have changed while the message waited).
    if (next) this.admit(g, w, next, false, this.deps.now())
  }

  /**
   * The group's consumers changed (or one was disabled): each partition's consumer is chosen
   * again, and messages parked for want of one (or while paused) go out, then new ones.
   */
  consumersChanged(g: GroupRuntime, consumers: ConsumerRow[]): void {
    const kept = new Set(consumers.map((c) => c.id))
    for (const c of g.consumers) if (!kept.has(c.id)) this.deps.windows.forget(c.id)
    g.consumers = consumers
    const owners = assignPartitions(g.topic.partitions, consumers)
    g.consumerOf = owners.map((id) => consumers.find((c) => c.id === id) ?? null)
    this.limitConsumers(g)
    for (const w of g.parts.values()) {
      for (const o of w.outstanding.values()) if (o.state === 'parked') this.start(g, w, o)
      this.fill(g, w)
    }
  }

  /**
   * Gives each consumer of the group its fixed limits (rateLimitPerSecond, maxConcurrency), scaled
   * to the share of its partitions this process pushes: called when the consumers change and when
   * a partition of the group comes or goes.
   */
  limitConsumers(g: GroupRuntime): void {
    const total = new Map<string, number>()
    const here = new Map<string, number>()
    g.consumerOf.forEach((c, p) => {
      if (!c) return
      total.set(c.id, (total.get(c.id) ?? 0) + 1)
      if (g.parts.has(p)) here.set(c.id, (here.get(c.id) ?? 0) + 1)
    })
    for (const c of g.consumers) {
      const n = total.get(c.id)
      if (n) this.deps.windows.limit(c.id, c, (here.get(c.id) ?? 0) / n, g.row.batchMaxMessages !== null)
    }
  }

  // ---- the filter ----

  /**
   * Completes a message the group's filter does not match: no push, no attempt, no attempt row.
   * It takes no slot and nothing waits for the write (so it waits for company: lazy): until it is
   * written, the partition's committed offset cannot pass it (the progress writer moves it in the
   * same statement that counts it), and after a crash the next owner reads the message again and
   * filters it again.
   */
  private filterOut(g: GroupRuntime, w: PartitionState, offset: number): void {
    this.deps.metrics?.filtered(g.row.name)
    const req: CompletionRequest = { g, w, offset, outcome: 'filtered' }
    const write = () =>
      this.deps.progress.complete(
        req,
        () => {},
        (err: unknown) => {
          if (w.dropped) return
          this.deps.log.error({ err, group: g.row.name, partition: w.partition }, 'recording a filtered message failed; retrying in 1 s')
          this.deps.timers.setTimeout(() => {
            if (!w.dropped) write()
          }, 1000)
        },
        // Lazy (progress.ts lazyMs): it holds no slot and no key. (A pull group's jobs never wait.)
        true,
      )
    write()
  }

  /** The group's filter changed: it applies to every message not pushed yet, those already admitted too. */
  filterChanged(g: GroupRuntime, filter: GroupRuntime['filter']): void {
    g.filter = filter
    for (const w of g.parts.values()) w.unmatch()
  }

  // ---- a push ----

  /**
   * Starts an attempt of the message: a push to the partition's consumer, or (a pull group) a
   * lease to the first caller waiting here with room. One path for both: the attempt, its ack
   * deadline on the one tracker, its row, the reservation before a first attempt and the fence
   * before a retry are the same; only the transport (Transport below) differs. A lease's envelope
   * goes into the caller's answer and the attempt is never `pushing`, so an ack, nack or extend
   * acts on it at once.
   */
  private start(g: GroupRuntime, w: PartitionState, o: Outstanding): void {
    if (!o.matched && o.attempts === 0 && o.state !== 'reserving') {
      w.matched(o)
      if (g.filter && !g.filter(o.msg)) {
        this.cancel(w, o)
        w.move(o, 'completing')
        this.forget(g, w, o)
        this.filterOut(g, w, o.msg.offset)
        return this.fill(g, w)
      }
    }
    const pull = g.row.delivery === 'pull'
    const consumer = pull ? null : g.consumerOf[w.partition]
    if (g.row.paused || (!consumer && !pull) || this.deps.stopped() || w.releasing || w.dropped) return w.move(o, 'parked')
    // Attempts made before a restart count: one that already had them all is dead-lettered now.
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, o.lastError ?? `${o.attempts} attempts before a restart`)
    // No room (the consumer's window full, or no caller waiting with room): it waits, ready.
    const transport = consumer ? this.pushTo(g, w, o, consumer) : this.leaseTo(g, w, o)
    if (!transport) return
    // A first push the reservation covers goes as soon as it may; one above it waits for a reservation.
    const covered = o.attempts === 0 && o.msg.offset < w.reservedTo
    // A reservation covers no more than can go out (the callers' room, the consumer's window): a
    // message reserved and never pushed would be counted as attempted by the next owner after a
    // crash (dead at maxDeliveries 1). So nothing else takes the room a pending reservation was
    // promised (a retry coming due meanwhile waits, ready); the reservation's end fills again.
    if (!covered && !transport.reservable(o)) return w.move(o, 'ready')
    if (o.attempts === 0 && !covered) {
      w.move(o, 'reserving')
      return this.reservations.reserve(g, w)
    }
    // Ownership proven before an attempt begins (push-send.ts PushLease): a process stopped or
    // starved past its lease may have lost the partition, and an attempt begun now could undercut
    // the new owner's attempt numbers. Until it is proven again the message waits, ready.
    if (!this.leaseHeld(g, w)) return w.move(o, 'ready')
    const attempt = o.attempts + 1
    if (attempt > 1) this.deps.metrics?.redelivered(g.row.name)
    const id = newDeliveryId({ groupId: g.row.id, partition: w.partition, offset: o.msg.offset, attempt })
    const nowMs = this.deps.now()
    const deadlineMs = nowMs + transport.leaseMs
    const a = w.begin(o, id)
    // In auto mode the answer settles a push; a deadline is needed only if it can pass before the push's timeout.
    if (pull || g.row.ackMode === 'explicit' || g.row.ackTimeoutMs < g.row.pushTimeoutMs) {
      w.setDeadline(o, a, this.deps.schedule.ackDeadline(id, g.row.id, w.partition, o.msg.offset, attempt, deadlineMs))
    }
    // Every field from the start, the ones the outcome fills in too: a field added to an object
    // later changes its shape (a new hidden class, a larger backing store), at each push.
    const row: AttemptStart = {
      id,
      groupId: g.row.id,
      topicId: g.topic.id,
      partition: w.partition,
      offset: o.msg.offset,
      attempt,
      consumerId: consumer ? consumer.id : null,
      startedAtMs: nowMs,
      ackDeadlineMs: deadlineMs,
      outcome: undefined,
      finishedAtMs: undefined,
      statusCode: undefined,
      durationMs: undefined,
      error: undefined,
    }
    // The slot (a window's, a caller's) is taken now, while it is known to be free; the send, or giveBack, returns it.
    transport.take()
    if (covered) {
      this.deps.attempts.started(row)
      return transport.send(o, a, deadlineMs, nowMs)
    }
    // A retry's row is written before it goes out: a crash then leaves the attempt on record, and
    // the next process counts it (retries are few, so waiting for the write costs little). With it,
    // a check that this process still holds the partition's epoch: one that lost it (paused past
    // its session, say) must not push or lease for it again.
    const current = () => w.inFlight(o, a)
    const fence = new Promise<boolean>((resolve, reject) => this.deps.progress.reserve(g, w, null, resolve, reject))
    // Until sent (Partition.unsent), a handover deletes its row: the next owner must not count an attempt never made.
    Promise.all([this.deps.attempts.durable(row), fence])
      .then(
        ([, held]) => {
          if (!held) {
            transport.giveBack()
            return this.deps.moved(g, w)
          }
          if (current() && !this.deps.stopped() && !w.releasing) {
            transport.send(o, a, deadlineMs, this.deps.now())
          } else {
            if (!w.releasing && !w.dropped && !this.deps.stopped()) w.recorded(a)
            transport.giveBack()
          }
        },
        (err: unknown) => {
          w.recorded(a)
          transport.giveBack()
          if (!current()) return
          // Not sent, and not on record: the attempt did not happen. Try again in a second.
          this.deps.log.error(
            { err, group: g.row.name, partition: w.partition, offset: o.msg.offset },
            'recording a retry failed; retrying in 1 s',
          )
          this.dropDeadline(a)
          w.undo(o, a)
          this.wait(g, w, o, 'retry', this.deps.now() + 1000)
        },
      )
      .catch((err: unknown) => this.deps.log.error({ err, group: g.row.name }, 'starting a retry failed'))
  }

  /** A push to the partition's consumer, or undefined (the message waits, ready) while its push window is full. */
  private pushTo(g: GroupRuntime, w: PartitionState, o: Outstanding, consumer: ConsumerRow): Transport | undefined {
    const windows = this.deps.windows
    const win = windows.of(consumer.id)
    const joining = this.sender.isOpen(w, consumer)
    // The consumer has as many pushes under way as it has shown it can take: wait for one to end.
    if (!windows.hasRoom(win, joining)) {
      w.move(o, 'ready')
      return void windows.wait(win, consumer.id, g, w, joining)
    }
    return {
      leaseMs: g.row.ackTimeoutMs,
      reservable: (o) => {
        const free = windows.free(win)
        // (win.batching is set only for a consumer with fixed limits: the group says whether it batches.)
        return (
          this.reservations.promisedTo(g, consumer.id, o) <
          (g.row.batchMaxMessages !== null ? Math.max(1, free) * g.row.batchMaxMessages : free)
        )
      },
      take: () => windows.started(win),
      send: (o, a, deadlineMs, nowMs) => this.sender.send(g, w, o, a, consumer, deadlineMs, nowMs),
      giveBack: () => {
        win.window.release('neutral')
        windows.wake(consumer.id)
      },
    }
  }

  /** A lease to the first caller of pull waiting here with room, or undefined (the message waits, ready, and a probe hears of it). */
  private leaseTo(g: GroupRuntime, w: PartitionState, o: Outstanding): Transport | undefined {
    const pulls = this.deps.pulls
    const taker = pulls.taker(g.row.id)
    if (!taker) {
      w.move(o, 'ready')
      return void pulls.leasable(g.row.id)
    }
    return {
      leaseMs: taker.leaseMs,
      // The callers' room, counted over every partition of the group.
      reservable: () => this.reservations.roomBeyondReservations(g) > 0,
      take: () => pulls.take(taker),
      send: (o, a, deadlineMs) => {
        // A span id of its own per attempt, in the message's trace (a `pull` span's, with tracing on).
        const traceparent = leaseAttempt(o.msg, a.number, g.topic, g.row.name, w.partition)
        const target = {
          groupName: g.row.name,
          topicName: g.topic.name,
          topicId: g.topic.id,
          partition: w.partition,
          pushFormat: 'envelope' as const,
          consumerSecrets: [],
        }
        const handed = pulls.hand(taker, buildEnvelope(target, o.msg, a.id, a.number, deadlineMs, traceparent))
        w.went(a)
        // Its caller was answered while this retry's row and fence were written (it left, its waitMs
        // or a pull-without-wait's limit passed, its group closed): leasable again at once, as a
        // forwarded caller's give-back makes it, not stranded until its deadline.
        if (!handed)
          queueMicrotask(() =>
            this.safely(() => {
              if (w.inFlight(o, a)) this.unlease(g, w, o, a, 'the caller of pull was answered before the lease was handed to it')
            }),
          )
      },
      giveBack: () => pulls.unhand(taker),
    }
  }

  /**
   * Whether this process can prove it still owns its partitions (push-send.ts PushLease). When it
   * cannot, the partition is filled again once it can (one wait per partition, however many
   * messages wait).
   */
  private leaseHeld(g: GroupRuntime, w: PartitionState): boolean {
    const lease = this.deps.lease
    if (!lease || lease.held()) return true
    if (!this.leaseWaits.has(w)) {
      this.leaseWaits.add(w)
      lease.wait(() =>
        this.safely(() => {
          this.leaseWaits.delete(w)
          if (!w.dropped && !g.dropped) this.fill(g, w)
        }),
      )
    }
    return false
  }

  /**
   * A lease whose caller went away before its answer reached it (or was answered before the lease
   * was handed to it): the message is leasable again at once. Not counted when its row is not written yet (a first lease, the common case: the attempt
   * did not happen); a retry's row is written before it is handed, so that one ends as a failed
   * attempt, leased again without the backoff.
   */
  unlease(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, why = 'the caller of pull went away before its answer'): void {
    this.dropDeadline(a)
    if (this.deps.attempts.forget(a.id)) {
      w.undo(o, a)
      return this.wait(g, w, o, 'retry', this.deps.now())
    }
    this.deps.attempts.update({ id: a.id, outcome: 'failed', finishedAtMs: this.deps.now(), error: why })
    w.settle(o, a, true)
    this.failed(g, w, o, why, undefined, 0)
  }

  /** A push's answer, as it bears on its attempt: the row's details, then the attempt settled (or nothing, if it was already). */
  private settleAttempt(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, consumer: ConsumerRow, r: PushResult): void {
    const id = a.id
    // (A partition being handed over is told here when its last push is answered.)
    const nack = w.answered(a)
    if (nack) {
      if (w.outstanding.get(o.msg.offset) === o && o.state === 'nacked') {
        const why = r.kind === 'delivered' ? undefined : errorOf(r, g.row.pushTimeoutMs)
        this.deps.attempts.update({
          id,
          durationMs: r.durationMs,
          ...(r.kind === 'rejected' ? { statusCode: r.status } : {}),
          ...(why ? { error: why } : {}),
        })
        // 410 Gone disables the consumer whichever way the attempt was settled.
        if (r.kind === 'rejected' && r.status === 410) this.disable(g, consumer)
        return this.nacked(g, w, o, why ? `nacked: ${why}` : 'nacked', nack.delayMs, nack.deadLetter)
      }
    }
    const current = w.inFlight(o, a)
    if (r.kind === 'delivered') {
      this.deps.attempts.update({ id, statusCode: r.status, durationMs: r.durationMs })
      if (current && g.row.ackMode === 'auto') this.complete(g, w, o, a)
      return
    }
    const error = errorOf(r, g.row.pushTimeoutMs)
    // Not current: the message was acked (or the partition seeked) while the push was under way;
    // the attempt row keeps the outcome that gave it, with this answer's details.
    this.deps.attempts.update({
      id,
      finishedAtMs: this.deps.now(),
      durationMs: r.durationMs,
      error,
      ...(current ? { outcome: 'failed' as const } : {}),
      ...(r.kind === 'rejected' ? { statusCode: r.status } : {}),
    })
    if (r.kind === 'rejected' && r.status === 410) this.disable(g, consumer)
    if (!current) return
    this.dropDeadline(a)
    w.settle(o, a, true)
    this.failed(g, w, o, error, r.kind === 'rejected' ? r.retryAfterMs : undefined)
  }

  /** An auto ack: the 2xx completes the message. */
  private complete(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt): void {
    this.cancel(w, o)
    w.move(o, 'completing')
    const req: CompletionRequest = { g, w, offset: o.msg.offset, outcome: 'acked' }
    this.deps.progress.complete(
      req,
      (status) => this.safely(() => this.completed(req, a.id, status === 'acked' ? 'acked' : undefined)),
      (err: unknown) => {
        this.deps.log.error({ err }, 'recording an auto ack failed; the message will be pushed again')
        this.safely(() => this.completionFailed(req))
      },
      // Lazy: nothing waits on it, unless ordered (the next message of its key or partition) or
      // unless the completions unwritten would keep the next message out.
      g.row.ordering === 'none' && w.completionsMayWait(g.row.maxInFlight),
    )
    // Its slot is free: the next message goes out while this completion is written (the two share
    // the writer's next statement when the next one needs a reservation).
    this.fill(g, w)
  }

  // ---- failures, retries and dead letters ----

  /** A failed attempt: dead-letter after maxDeliveries, else wait out the backoff. */
  failed(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, retryAfterMs?: number, delayMs?: number): void {
    w.noteError(o, error)
    if (o.attempts >= g.row.maxDeliveries) return this.deadLetter(g, w, o, error)
    const waitMs = delayMs ?? honourRetryAfterMs(nextDelayMs(o.attempts, g.policy), retryAfterMs, g.policy)
    this.wait(g, w, o, 'retry', this.deps.now() + waitMs)
  }

  /** A nacked attempt: dead-lettered at once when asked, else a failed attempt. */
  nacked(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string, delayMs: number | undefined, deadLetter: boolean): void {
    if (deadLetter) {
      // Kept as the last error too: a dead letter whose write fails is retried with this text.
      const why = `${error}; dead-lettered by the nack`
      w.noteError(o, why)
      this.deadLetter(g, w, o, why)
    } else {
      this.failed(g, w, o, error, undefined, delayMs)
    }
  }

  /**
   * The consumer nacked the current attempt `a`. While its push is still under way (a consumer
   * library nacks before it answers) the answer decides, so a dead letter carries its error.
   */
  nack(g: GroupRuntime, w: PartitionState, o: Outstanding, a: Attempt, delayMs: number | undefined, deadLetter: boolean): void {
    this.dropDeadline(a)
    // The error says why it ended even after the row is marked dead (dead-lettered by this nack or after it).
    this.deps.attempts.update({ id: a.id, outcome: 'nacked', finishedAtMs: this.deps.now(), error: 'nacked by the consumer' })
    if (a.pushing) return w.nackDuringPush(o, a, { delayMs, deadLetter })
    w.settle(o, a, true)
    this.nacked(g, w, o, 'nacked', delayMs, deadLetter)
  }

  private deadLetter(g: GroupRuntime, w: PartitionState, o: Outstanding, error: string): void {
    w.move(o, 'completing')
    const req: CompletionRequest = { g, w, offset: o.msg.offset, outcome: 'dead' }
    const dlq = g.row.deadLetterTopic
    const write = async () => {
      if (dlq) {
        const topic = await this.deps.findTopic(dlq)
        if (!topic) throw new Error(`dead-letter topic ${dlq} does not exist`)
        req.deadLetter = deadLetterEntry(g, w, o, topic, error)
      }
      return this.deps.progress.completeAll([req])
    }
    write()
      .then(
        ([status]) => {
          // An ack can win the race with the dead-lettering; then the message is simply acked.
          if (status === 'dead') {
            this.deps.metrics?.deadLettered(g.row.name)
            recordDeadLetter(o.msg, g.topic.name, g.row.name, o.attempts, dlq, error)
          }
          this.completed(req, o.tries.at(-1)?.id, status === 'dead' ? 'dead' : undefined)
        },
        (err: unknown) => {
          this.deps.log.error(
            { err, group: g.row.name, partition: w.partition, offset: o.msg.offset },
            'dead-lettering failed; retrying in 5 s',
          )
          // Unless an ack or a seek settled the message meanwhile.
          if (w.dropped || w.outstanding.get(o.msg.offset) !== o || o.state !== 'completing') return
          this.cancel(w, o)
          this.wait(g, w, o, 'dead_letter_retry', this.deps.now() + 5000)
        },
      )
      .catch((err: unknown) => this.deps.log.error({ err }, 'settling a dead letter failed'))
  }

  // ---- completion ----

  /** After a completion is durable: forget the message, log the outcome, push the next. */
  completed(req: CompletionRequest, deliveryId: string | undefined, outcome: 'acked' | 'dead' | undefined): void {
    if (req.w.dropped) return // moved or seeked: nothing here is ours any more
    const o = req.w.outstanding.get(req.offset)
    const finishedAtMs = this.deps.now()
    const ownOpen = o?.tries.some((a) => a.id === deliveryId && a.open) ?? false
    if (o) {
      this.completing(req.w, o)
      this.forget(req.g, req.w, o)
      // Attempts still open end with the message's outcome (a late ack of attempt 1 also
      // settles attempt 2, which was pushed meanwhile).
      for (const a of o.tries) {
        if (!a.open) continue
        req.w.close(a)
        this.deps.attempts.update(
          outcome
            ? { id: a.id, outcome, finishedAtMs }
            : { id: a.id, outcome: 'failed', finishedAtMs, error: 'the message was completed by another attempt' },
        )
      }
    }
    if (deliveryId && outcome && !ownOpen) {
      // The attempt that dead-letters its message has ended already (failed, timed out or nacked):
      // it is marked dead, but keeps when it ended, its status code and its error, which say why.
      this.deps.attempts.update(outcome === 'dead' ? { id: deliveryId, outcome } : { id: deliveryId, outcome, finishedAtMs })
    }
    this.fill(req.g, req.w)
  }

  /** A completion could not be written: the message stays outstanding and is pushed again soon. */
  completionFailed(req: CompletionRequest): void {
    const o = req.w.outstanding.get(req.offset)
    if (req.w.dropped || !o || o.state !== 'completing' || req.w.completed.has(req.offset)) return
    this.wait(req.g, req.w, o, 'retry', this.deps.now() + 1000)
  }

  // ---- deadlines and waits ----

  /** An ack deadline passed or a wait ended (the schedule calls this; it never throws). */
  due(entry: TrackerEntry | Wait): void {
    this.safely(() => {
      const g = this.deps.group(entry.groupId)
      const w = g?.parts.get(entry.partition)
      const o = w?.outstanding.get(entry.offset)
      if (!g || !w || !o) return
      if (entry instanceof Wait) {
        if (o.wait !== entry) return
        w.waitEnded(o, entry)
        if (entry.kind === 'dead_letter_retry') return this.deadLetter(g, w, o, o.lastError ?? 'dead-lettered')
        if (entry.kind === 'delay' && g.row.ordering !== 'partition') {
          // Due now, and active from here on: wait for a slot if the partition is full.
          if (!w.hasRoom(g.row.maxInFlight)) return w.move(o, 'ready')
          w.move(o, 'parked')
        }
        return this.start(g, w, o)
      }
      const a = o.current
      if (!a || a.deadline !== entry) return
      // An attempt not sent yet (its retry row being written, waiting for the lease, queued for a
      // connection) has not gone out: its deadline is put off while it waits, or its number would be
      // skipped (and a message dead-lettered after attempts never made). Also while the partition is
      // handed over: it goes before that, or not at all and the handover gives its number back. Once
      // it goes, the deadline last set stands (the client's queue is bounded by the push timeout).
      if (w.unsent.has(a.id)) {
        w.setDeadline(
          o,
          a,
          this.deps.schedule.ackDeadline(a.id, g.row.id, w.partition, o.msg.offset, a.number, this.deps.now() + g.row.ackTimeoutMs),
        )
        return
      }
      w.settle(o, a, true)
      const why = g.row.delivery === 'pull' ? 'the lease passed without an ack' : `no ack within ${g.row.ackTimeoutMs} ms`
      this.deps.attempts.update({ id: a.id, outcome: 'timed_out', finishedAtMs: this.deps.now(), error: why })
      // Took the push but not the message in time: as much a sign of overload as a slow answer.
      if (o.pushedTo) {
        this.deps.windows.find(o.pushedTo)?.window.shrink()
        this.deps.health?.failure(o.pushedTo, `no ack within ${g.row.ackTimeoutMs} ms`)
      }
      this.failed(g, w, o, why)
    })
  }

  /** Puts a message on the schedule: its delay, a retry's backoff, or dead-lettering again. */
  private wait(g: GroupRuntime, w: PartitionState, o: Outstanding, kind: Wait['kind'], atMs: number): void {
    w.waitFor(o, this.deps.schedule.wait(kind, g.row.id, w.partition, o.msg.offset, atMs))
  }

  /** Takes the message off the schedule (its current attempt's ack deadline, or its wait): the attempt, if any, is settled. */
  cancel(w: PartitionState, o: Outstanding): void {
    if (o.current) this.dropDeadline(o.current)
    if (o.wait) this.deps.schedule.cancel(o.wait)
    w.unschedule(o)
  }

  /** The message is being completed (an ack, or a completion written): off the schedule, `completing`. */
  completing(w: PartitionState, o: Outstanding): void {
    this.cancel(w, o)
    w.move(o, 'completing')
  }

  private dropDeadline(a: Attempt): void {
    if (a.deadline) this.deps.schedule.cancel(a.deadline)
  }

  /** Forgets an outstanding message (its partition moved, its group changed): its open attempts end as failed. */
  abandon(w: PartitionState, o: Outstanding, reason: string): void {
    this.cancel(w, o)
    const finishedAtMs = this.deps.now()
    for (const a of o.tries) {
      if (!a.open) continue
      w.close(a)
      this.deps.attempts.update({ id: a.id, outcome: 'failed', finishedAtMs, error: reason })
    }
  }

  /**
   * 410 Gone: the consumer gets nothing more until registered again. Disabled in memory at once,
   * so the retry that follows goes to the partition's new consumer, then recorded in the database
   * (the dispatcher keeps a reload that reads the consumers before that write from undoing it).
   */
  private disable(g: GroupRuntime, pushedTo: ConsumerRow): void {
    // The group's consumers as they are now: a reload between the push and its answer (the group
    // changed, a reconciliation) replaced the row the push was made with, and disabling that stale
    // row alone left the consumer enabled for the retry (seen in CI: a second push to a 410 consumer).
    const consumer = g.consumers.find((c) => c.id === pushedTo.id) ?? pushedTo
    if (consumer.disabledAt !== null) return
    consumer.disabledAt = new Date(this.deps.now())
    consumer.disabledReason = 'answered 410 Gone'
    this.consumersChanged(g, g.consumers)
    this.deps
      .disableConsumer(g.row.id, consumer.id, consumer.disabledReason, consumer.disabledAt)
      .catch((err: unknown) => this.deps.log.error({ err, consumer: consumer.id }, 'recording a disabled consumer failed'))
  }

  /** Runs a step outside any caller that could handle its error: logs instead of crashing. */
  safely(fn: () => void): void {
    try {
      fn()
    } catch (err) {
      this.deps.log.error({ err }, 'dispatcher step failed')
    }
  }
}

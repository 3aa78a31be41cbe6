/**
 * Group commit: produce calls that arrive while a commit is running wait in a queue and are then
 * written together in one transaction, so throughput grows with concurrency instead of paying one
 * fsync per call. A call is never split across transactions (produce is all or nothing).
 *
 * States of a call: queued → committing → resolved | rejected.
 * Bounded: past `maxPendingMessages` or `maxPendingBytes` queued, submit() refuses at once with
 * 503 + Retry-After rather than letting the queue (and latency, and memory) grow without limit.
 *
 * With `keyOf` (produce: an entry's partition), a commit starts beside those running only while
 * each of them carries a single call (the load is light: nothing is gathering behind them), and only
 * with calls whose keys none of them holds, taken in order up to the first that shares one. Appends
 * to one partition serialise on its lock anyway, so a commit that overlaps a running one would only
 * wait for it; one that does not saves a lone call the wait for a commit it has nothing to do with
 * (at low rates, up to a whole commit's time: most of a call's p99). Once commits carry several
 * calls, the queue waits and gathers one batch, as with a single commit at a time: commits beside
 * them then only split the batches (more statements per message, f7c73b6). A call never passes an
 * earlier one: commits of a key go in call order.
 */
import { HookqError } from '../core/errors.ts'

export interface CommitLimits {
  /** Messages one transaction takes at most (a single larger call still goes alone). */
  maxBatchMessages: number
  /** Transactions running at once; more overlap commits' fsyncs, fewer batch better. */
  maxConcurrentCommits: number
  maxPendingMessages: number
  maxPendingBytes: number
}

interface Pending<E, R> {
  entries: E[]
  bytes: number
  /** The entries' keys (keyOf), when the committer has one. */
  keys: number[] | undefined
  resolve(results: R[]): void
  reject(err: unknown): void
}

export class GroupCommitter<E, R> {
  private queue: Pending<E, R>[] = []
  private head = 0
  private pendingMessages = 0
  private pendingBytes = 0
  private running = 0
  private closed = false
  private idleWaiters: (() => void)[] = []
  /** Keys held by the commits running, with how many of them hold each (keyOf only). */
  private readonly held = new Map<number, number>()
  /** Calls in the commits running. */
  private runningCalls = 0

  /**
   * `commit` writes entries in one transaction and returns one result per entry, in order.
   * `keyOf`: what commits conflict on (see the header); without it, any commits run at once.
   */
  constructor(
    private readonly commit: (entries: E[]) => Promise<R[]>,
    private readonly limits: CommitLimits,
    private readonly keyOf?: (entry: E) => number,
  ) {}

  /** Queues the entries for the next commit; resolves with their results once committed. */
  submit(entries: E[], bytes: number): Promise<R[]> {
    if (this.closed) {
      return Promise.reject(new HookqError('unavailable', 'the broker is shutting down', { retryAfterS: 1 }))
    }
    // An empty queue always takes the call, however large, so no call can be refused forever.
    if (
      this.pendingMessages > 0 &&
      (this.pendingMessages + entries.length > this.limits.maxPendingMessages || this.pendingBytes + bytes > this.limits.maxPendingBytes)
    ) {
      return Promise.reject(
        new HookqError(
          'overloaded',
          `produce backlog is full (${this.pendingMessages} messages, ${this.pendingBytes} bytes waiting for a commit)`,
          { retryAfterS: 1 },
        ),
      )
    }
    return new Promise<R[]>((resolve, reject) => {
      this.queue.push({ entries, bytes, keys: this.keyOf && entries.map(this.keyOf), resolve, reject })
      this.pendingMessages += entries.length
      this.pendingBytes += bytes
      this.pump()
    })
  }

  /** Messages waiting for a commit (not counting those being committed). */
  get backlog(): number {
    return this.pendingMessages
  }

  /** Stops taking new calls and resolves once every queued call has been committed or failed. */
  async drain(): Promise<void> {
    this.closed = true
    await this.settled()
  }

  /** Resolves once every call queued so far (and any queued meanwhile) has been committed or failed; keeps taking calls. */
  async settled(): Promise<void> {
    if (this.running === 0 && this.head === this.queue.length) return
    await new Promise<void>((resolve) => this.idleWaiters.push(resolve))
  }

  private pump(): void {
    while (this.running < this.limits.maxConcurrentCommits && this.head < this.queue.length) {
      // Beside running commits (keyOf): only while each carries one call (see the header).
      if (this.keyOf && this.running > 0 && this.runningCalls > this.running) return
      const batch = this.takeBatch()
      if (batch.length === 0) return
      this.running++
      this.runningCalls += batch.length
      void this.run(batch)
    }
  }

  /** Whether a call shares a key with a running commit (never, without keyOf). */
  private conflicts(p: Pending<E, R>): boolean {
    if (p.keys === undefined || this.held.size === 0) return false
    for (const k of p.keys) if (this.held.has(k)) return true
    return false
  }

  private hold(batch: Pending<E, R>[], by: 1 | -1): void {
    for (const p of batch) {
      if (p.keys === undefined) continue
      for (const k of p.keys) {
        const n = (this.held.get(k) ?? 0) + by
        if (n > 0) this.held.set(k, n)
        else this.held.delete(k)
      }
    }
  }

  /** The next calls in order, up to maxBatchMessages and, beside running commits, up to the first that conflicts with them (maybe none). */
  private takeBatch(): Pending<E, R>[] {
    const batch: Pending<E, R>[] = []
    let messages = 0
    while (this.head < this.queue.length) {
      const next = this.queue[this.head]!
      if (batch.length > 0 && messages + next.entries.length > this.limits.maxBatchMessages) break
      if (this.conflicts(next)) break
      batch.push(next)
      messages += next.entries.length
      this.pendingMessages -= next.entries.length
      this.pendingBytes -= next.bytes
      this.head++
    }
    // Compact the array now and then instead of shift()ing, which is O(n) per call.
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head)
      this.head = 0
    }
    this.hold(batch, 1)
    return batch
  }

  private async run(batch: Pending<E, R>[]): Promise<void> {
    let results: R[] | undefined
    let failure: unknown
    try {
      const entries = batch.length === 1 ? batch[0]!.entries : batch.flatMap((p) => p.entries)
      results = await this.commit(entries)
    } catch (err) {
      failure = err
    }
    this.running--
    this.runningCalls -= batch.length
    this.hold(batch, -1)
    // Start the next commit before waking this batch's callers: their responses take a while to
    // write, and the database should not sit idle meanwhile.
    this.pump()
    let at = 0
    for (const p of batch) {
      if (results) p.resolve(results.slice(at, at + p.entries.length))
      else p.reject(failure)
      at += p.entries.length
    }
    if (this.running === 0 && this.head === this.queue.length) {
      for (const wake of this.idleWaiters.splice(0)) wake()
    }
  }
}

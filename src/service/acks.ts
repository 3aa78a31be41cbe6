/**
 * The rules of acknowledgement at the service boundary: the group must exist; the cluster does the
 * rest (it hands each call to this process's dispatcher, or answers 503 while a group is still
 * loading here; src/cluster/cluster.ts).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import type { Cluster } from '../cluster/cluster.ts'
import type { AckStatus } from '../dispatch/dispatcher.ts'
import { HookqError } from '../core/errors.ts'
import { envelopeDeliveryId } from '../dispatch/envelope.ts'
import type { Metrics } from '../metrics.ts'
import type { GroupService } from './groups.ts'

/** What one pull asks for. */
export interface PullOptions {
  maxMessages: number
  waitMs: number
  leaseMs: number | undefined
}

/** What one source leased: the envelopes, and how to give them back should the caller have gone. */
export interface Leased {
  envelopes: string[]
  /** Makes the leases (their delivery ids) leasable again at once, as for a caller gone before its answer (best effort). */
  giveBack(deliveryIds: string[]): void
}

/** A broker process that owns `parts` of the group's partitions, and how to pull from it. */
export interface PullSource {
  parts: number
  /**
   * Leases up to opts.maxMessages (waitMs 0 when gathering). Without a signal: the answer always
   * reaches the gather, which gives back what its caller did not stay for.
   */
  pull(opts: PullOptions, signal?: AbortSignal): Promise<Leased>
  /** Waits up to waitMs until a message could be leased there, leasing none: true if one could. */
  probe(waitMs: number, signal: AbortSignal): Promise<boolean>
}

/** The other owners of a group's partitions, as the forwarding layer finds them. */
export interface PullElsewhere {
  /** The owners as this process sees them now: how many partitions it owns itself, and the others. */
  owners(): { selfParts: number; others: PullSource[] }
  /**
   * Calls `moved` when the group's partitions may have changed owners (owners() may answer
   * otherwise: a poll saw another holder, or this process took or let go of one); returns the unwatch.
   */
  watch(moved: () => void): () => void
}

/**
 * A gather's answer may come this long after waitMs at most: an owner that has not answered its
 * probe by then is left (a probe leases nothing, so leaving it loses nothing). The lease round
 * after a probe is not cut (what it leases must reach the caller); an owner bounds it itself.
 */
const GATHER_MARGIN_MS = 250

type Results = Promise<{ deliveryId: string; status: AckStatus }[]>

export class AckService {
  /** Long polls under way on this process (the cap: maxWaitingPulls). */
  private waitingPulls = 0
  /** Which owner the rounding of the next gather's split favours (see shares). */
  private turn = 0
  /** Signs the leases of a forwarded pull's answer (giveBackToken): this process's, never shown to a client. */
  private readonly giveBackKey = randomBytes(32)

  constructor(
    private readonly groups: GroupService,
    private readonly cluster: Pick<Cluster, 'hasGroup' | 'ack' | 'nack' | 'extend' | 'deliveryOf' | 'pull' | 'probe' | 'giveBack'>,
    private readonly metrics?: Pick<Metrics, 'acked'>,
    /** Long polls (waitMs > 0, probes included) that may wait here at once; more are refused with 429. */
    private readonly maxWaitingPulls = 10_000,
  ) {}

  /** 404 for a group that does not exist; the dispatcher knows the running ones without a query. */
  private async requireGroup(group: string): Promise<void> {
    if (!this.cluster.hasGroup(group)) await this.groups.get(group)
  }

  /**
   * Leases a pull group's messages (contract "Pull delivery"): their envelopes, as JSON texts.
   * `signal`: the caller went away (nothing more is leased to it). `elsewhere`: the other broker
   * processes owning partitions of the group (src/http/forward.ts), gathered from as well, and
   * gathered from afresh when partitions move during the wait.
   */
  async pull(group: string, opts: PullOptions, signal: AbortSignal, elsewhere?: PullElsewhere | null): Promise<string[]> {
    await this.requirePull(group)
    return this.waiting(opts.waitMs, async () => {
      const local = (parts: number): PullSource => ({
        parts,
        pull: async (o, s) => ({ envelopes: await this.cluster.pull(group, o, s), giveBack: (ids) => this.cluster.giveBack(group, ids) }),
        probe: (ms, s) => this.cluster.probe(group, ms, s),
      })
      const deadlineMs = performance.now() + opts.waitMs
      let leased: Leased
      for (;;) {
        // The owners are those seen now; a partition that moves while the poll waits may go to an
        // owner it does not wait on (a process that owned none, this one included), where a message
        // produced then would wait unseen until waitMs. So a move cuts the wait, and the poll goes
        // on over the owners as they are then, with the time left (and leases at once what is
        // leasable there already).
        const moved = new AbortController()
        const cut = new AbortController()
        const stop = () => cut.abort()
        signal.addEventListener('abort', stop, { once: true })
        moved.signal.addEventListener('abort', stop, { once: true })
        const unwatch = opts.waitMs > 0 ? elsewhere?.watch(() => moved.abort()) : undefined
        try {
          const now = elsewhere?.owners()
          const waitMs = Math.min(opts.waitMs, Math.max(0, Math.round(deadlineMs - performance.now())))
          const round = { ...opts, waitMs }
          leased =
            !now || now.others.length === 0
              ? await local(0).pull(round, cut.signal)
              : await this.gather(round, cut.signal, [local(now.selfParts), ...now.others])
        } finally {
          unwatch?.()
          signal.removeEventListener('abort', stop)
        }
        if (leased.envelopes.length > 0 || signal.aborted || !moved.signal.aborted || performance.now() >= deadlineMs) break
      }
      const got = leased.envelopes
      // The caller went away while its answer was made: what was leased for it is not spent on
      // nobody but leasable again at once, on this process and on the other owners it came from
      // (forward.ts sends theirs back). Nobody reads this answer.
      if (signal.aborted && got.length > 0) {
        leased.giveBack(got.map(envelopeDeliveryId))
        return []
      }
      // A long poll answered empty may have been ended by its group's deletion or switch to push.
      if (got.length === 0 && opts.waitMs > 0 && !signal.aborted) await this.requirePull(group)
      return got
    })
  }

  /**
   * For another broker process's gather (a forwarded probe): waits up to waitMs until a message
   * could be leased on the partitions owned here, leasing none.
   */
  async probe(group: string, waitMs: number, signal: AbortSignal): Promise<boolean> {
    await this.requirePull(group)
    return this.waiting(waitMs, async () => {
      const ready = await this.cluster.probe(group, waitMs, signal)
      if (!ready && !signal.aborted) await this.requirePull(group)
      return ready
    })
  }

  /**
   * For a forwarded pull's answer that leased: a token with which only the gathering process (it
   * never reaches the client) can give these leases back (giveBackForwarded). An HMAC of the
   * group and the ids under a key of this process's: nothing is kept per answer.
   */
  giveBackToken(group: string, envelopes: readonly string[]): string {
    return this.sign(group, envelopes.map(envelopeDeliveryId))
  }

  /**
   * A gathering process's caller went away before its answer: the leases this process made for it
   * (named by the token of their answer) are leasable again at once, as for a caller of its own
   * (dispatcher giveBack: those no longer current are left alone). A token that does not match is
   * a 400: a client must not give back leases uncounted, which would let a message dodge maxDeliveries.
   */
  giveBackForwarded(group: string, deliveryIds: string[], token: string): void {
    const want = Buffer.from(this.sign(group, deliveryIds))
    const got = Buffer.from(token)
    if (got.length !== want.length || !timingSafeEqual(got, want))
      throw new HookqError('invalid_request', 'the give-back token does not match these deliveries')
    this.cluster.giveBack(group, deliveryIds)
  }

  private sign(group: string, deliveryIds: readonly string[]): string {
    const h = createHmac('sha256', this.giveBackKey).update(group)
    for (const id of deliveryIds) h.update('\n').update(id)
    return h.digest('base64url')
  }

  /** Long polls under way on this process (the hookq_pulls_waiting gauge). */
  get pullsWaiting(): number {
    return this.waitingPulls
  }

  /** 404 for no such group, 409 push_group for a push group. */
  private async requirePull(group: string): Promise<void> {
    const delivery = this.cluster.deliveryOf(group) ?? (await this.groups.get(group)).delivery
    if (delivery !== 'pull')
      throw new HookqError('push_group', `group ${group} is a push group (delivery "push"): its messages are pushed to its consumers`)
  }

  /**
   * Runs a pull, counted as a long poll when it may wait: past maxWaitingPulls of them a new one is
   * shed at once (each holds a connection and a timer until waitMs).
   */
  private async waiting<T>(waitMs: number, run: () => Promise<T>): Promise<T> {
    if (waitMs === 0) return run()
    if (this.waitingPulls >= this.maxWaitingPulls)
      throw new HookqError('too_many_pulls', `${this.waitingPulls} pull calls are waiting on this broker process; retry after 1 s`, {
        retryAfterS: 1,
      })
    this.waitingPulls++
    try {
      return await run()
    } finally {
      this.waitingPulls--
    }
  }

  /**
   * One pull over several owners, in two phases so that no owner leases what the caller will not
   * take (a lease not handed to a caller is an attempt lost, counted toward maxDeliveries):
   *
   * 1. lease at once from every owner, maxMessages split between them (never more in all);
   * 2. if that found nothing and the caller waits: probe every owner with the time left (a probe
   *    leases nothing), and when one says a message could go, lease at once again (1); repeat
   *    until something is leased or waitMs has passed. Probes left waiting are cut, losing nothing.
   *
   * Leasing without waiting first keeps the common case (a backlog) to one round; docs/walkthroughs.md,
   * "A walk through pull delivery", says why gathering beats routing to one owner.
   */
  private async gather(opts: PullOptions, signal: AbortSignal, all: PullSource[]): Promise<Leased> {
    const sources = all.filter((s) => s.parts > 0)
    const deadlineMs = performance.now() + opts.waitMs
    const first = this.turn++
    let got = await leaseNow(sources, shares(sources, opts.maxMessages, first), opts)
    for (let round = 1; got.envelopes.length === 0 && !signal.aborted; round++) {
      const leftMs = Math.round(deadlineMs - performance.now())
      if (leftMs <= 0) break
      const ready = await probeAll(sources, leftMs, signal)
      if (ready.length === 0) break // the wait passed, or every owner ended it (group deleted, broker closing)
      got = await leaseNow(sources, shares(sources, opts.maxMessages, first + round, ready), opts)
    }
    return got
  }
  /** Completes the deliveries' messages; answered once durable. */
  async ack(group: string, deliveryIds: string[]): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.ack(group, deliveryIds))
  }

  /** Fails the deliveries' current attempts. */
  async nack(group: string, deliveryIds: string[], delayMs: number | undefined, deadLetter: boolean): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.nack(group, deliveryIds, delayMs, deadLetter))
  }

  /** Moves ack deadlines. */
  async extend(group: string, deliveryIds: string[], extendMs: number): Results {
    await this.requireGroup(group)
    return this.counted(group, await this.cluster.extend(group, deliveryIds, extendMs))
  }

  private counted(group: string, results: Awaited<Results>): Awaited<Results> {
    for (const r of results) this.metrics?.acked(group, r.status)
    return results
  }
}

/**
 * maxMessages split between the sources by the partitions each owns, never more in all. What the
 * split rounds off goes one each to the sources in turn from `first` (so an owner of few partitions
 * is asked in its turn, not never), to those in `ready` first; each of those gets at least one.
 */
export function shares(sources: readonly { parts: number }[], maxMessages: number, first: number, ready: readonly number[] = []): number[] {
  const total = sources.reduce((n, s) => n + s.parts, 0)
  const out = sources.map((s) => Math.floor((maxMessages * s.parts) / Math.max(1, total)))
  let left = maxMessages - out.reduce((n, k) => n + k, 0)
  const n = sources.length
  const order = [...ready, ...Array.from({ length: n }, (_, k) => (((first + k) % n) + n) % n).filter((i) => !ready.includes(i))]
  for (const i of order) {
    if (left === 0) break
    out[i]!++
    left--
  }
  // A ready source that got nothing (more sources ready than maxMessages) takes one from the largest.
  for (const i of ready) {
    if (out[i]! > 0) continue
    let from = -1
    for (let k = 0; k < n; k++) if (!ready.includes(k) && out[k]! > 0 && (from < 0 || out[k]! > out[from]!)) from = k
    if (from < 0) break
    out[from]!--
    out[i]!++
  }
  return out
}

/**
 * Every source with a share asked at once, without waiting; their answers merged (at most the sum
 * of the shares). Not cut when the caller goes: a round without waitMs ends at once (an owner
 * bounds it), and an answer cut in flight would strand its leases on the owner until they expire;
 * answered, they are given back (pull).
 */
async function leaseNow(sources: PullSource[], counts: number[], opts: PullOptions): Promise<Leased> {
  const none: Leased = { envelopes: [], giveBack: () => {} }
  let refused: HookqError | undefined
  const answers = await Promise.all(
    sources.map((s, i) =>
      counts[i]! === 0
        ? none
        : s.pull({ ...opts, maxMessages: counts[i]!, waitMs: 0 }).catch((err: unknown) => {
            refused ??= keyRefused(err)
            return none
          }),
    ),
  )
  if (refused) {
    // What the others leased goes back: the caller gets its 401 (or 403), not them.
    for (const a of answers) if (a.envelopes.length > 0) a.giveBack(a.envelopes.map(envelopeDeliveryId))
    throw refused
  }
  return {
    envelopes: answers.flatMap((a) => a.envelopes),
    // Each source's own ids back to it.
    giveBack: () => {
      for (const a of answers) if (a.envelopes.length > 0) a.giveBack(a.envelopes.map(envelopeDeliveryId))
    },
  }
}

/**
 * Every source probed for up to `waitMs`: the indexes of those that said a message could go, as
 * soon as one has (the others' probes are cut then), or none once all ended without (or the time
 * passed, plus a margin for an owner slow to answer).
 */
async function probeAll(sources: PullSource[], waitMs: number, signal: AbortSignal): Promise<number[]> {
  const cut = new AbortController()
  const stop = () => cut.abort()
  signal.addEventListener('abort', stop, { once: true })
  const timer = setTimeout(stop, waitMs + GATHER_MARGIN_MS)
  const ready: number[] = []
  let refused: HookqError | undefined
  try {
    await new Promise<void>((resolve) => {
      let open = sources.length
      cut.signal.addEventListener('abort', () => resolve(), { once: true })
      for (const [i, s] of sources.entries()) {
        s.probe(waitMs, cut.signal)
          .catch((err: unknown) => {
            refused ??= keyRefused(err)
            if (refused) resolve()
            return false
          })
          .then((yes) => {
            if (cut.signal.aborted) return // answered after the others were cut: too late to count
            if (yes) ready.push(i)
            if (yes || --open === 0) resolve()
          })
      }
    })
  } finally {
    clearTimeout(timer)
    signal.removeEventListener('abort', stop)
    cut.abort()
  }
  if (refused) throw refused
  return ready
}

/** An owner's refusal of the caller's key (src/http/forward.ts), which the gather answers with; undefined for any other failure. */
function keyRefused(err: unknown): HookqError | undefined {
  return err instanceof HookqError && (err.code === 'unauthorized' || err.code === 'forbidden') ? err : undefined
}

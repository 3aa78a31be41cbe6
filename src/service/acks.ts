/**
 * The rules of acknowledgement at the service boundary: the group must exist; the cluster does the
 * rest (it hands each call to this process's dispatcher, or answers 503 while a group is still
 * loading here; src/cluster/cluster.ts).
 */
import type { Cluster } from '../cluster/cluster.ts'
import type { AckStatus } from '../dispatch/dispatcher.ts'
import { HookqError } from '../core/errors.ts'
import type { Metrics } from '../metrics.ts'
import type { GroupService } from './groups.ts'

/** What one pull asks for. */
export interface PullOptions {
  maxMessages: number
  waitMs: number
  leaseMs: number | undefined
}

/** A broker process that owns `parts` of the group's partitions, and how to pull from it. */
export interface PullSource {
  parts: number
  /** Leases up to opts.maxMessages (waitMs 0 when gathering). */
  pull(opts: PullOptions, signal: AbortSignal): Promise<string[]>
  /** Waits up to waitMs until a message could be leased there, leasing none: true if one could. */
  probe(waitMs: number, signal: AbortSignal): Promise<boolean>
}

/** The other owners of a group's partitions, as the forwarding layer found them. */
export interface PullElsewhere {
  /** Partitions owned here. */
  selfParts: number
  owners: PullSource[]
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
   * processes owning partitions of the group (src/http/forward.ts), gathered from as well.
   */
  async pull(group: string, opts: PullOptions, signal: AbortSignal, elsewhere?: PullElsewhere | null): Promise<string[]> {
    await this.requirePull(group)
    return this.waiting(opts.waitMs, async () => {
      const got =
        !elsewhere || elsewhere.owners.length === 0
          ? await this.cluster.pull(group, opts, signal)
          : await this.gather(opts, signal, [
              {
                parts: elsewhere.selfParts,
                pull: (o, s) => this.cluster.pull(group, o, s),
                probe: (ms, s) => this.cluster.probe(group, ms, s),
              },
              ...elsewhere.owners,
            ])
      // The caller went away while its answer was made: what was leased for it is not spent on
      // nobody but leasable again at once (those of partitions owned here; a remote owner's
      // expire). Nobody reads this answer.
      if (signal.aborted && got.length > 0) {
        this.cluster.giveBack(
          group,
          got.map((e) => (JSON.parse(e) as { deliveryId: string }).deliveryId),
        )
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
  private async gather(opts: PullOptions, signal: AbortSignal, all: PullSource[]): Promise<string[]> {
    const sources = all.filter((s) => s.parts > 0)
    const deadlineMs = performance.now() + opts.waitMs
    const first = this.turn++
    let got = await leaseNow(sources, shares(sources, opts.maxMessages, first), opts, signal)
    for (let round = 1; got.length === 0 && !signal.aborted; round++) {
      const leftMs = Math.round(deadlineMs - performance.now())
      if (leftMs <= 0) break
      const ready = await probeAll(sources, leftMs, signal)
      if (ready.length === 0) break // the wait passed, or every owner ended it (group deleted, broker closing)
      got = await leaseNow(sources, shares(sources, opts.maxMessages, first + round, ready), opts, signal)
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

/** Every source with a share asked at once, without waiting; their answers merged (at most the sum of the shares). */
async function leaseNow(sources: PullSource[], counts: number[], opts: PullOptions, signal: AbortSignal): Promise<string[]> {
  const answers = await Promise.all(
    sources.map((s, i) =>
      counts[i]! === 0 ? [] : s.pull({ ...opts, maxMessages: counts[i]!, waitMs: 0 }, signal).catch(() => [] as string[]),
    ),
  )
  return answers.flat()
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
  try {
    await new Promise<void>((resolve) => {
      let open = sources.length
      cut.signal.addEventListener('abort', () => resolve(), { once: true })
      for (const [i, s] of sources.entries()) {
        s.probe(waitMs, cut.signal)
          .catch(() => false)
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
  return ready
}

/**
 * The rules of acknowledgement at the service boundary: the group must exist; the cluster does the
 * rest (it hands each call to this process's dispatcher, or answers 503 while a group is still
 * loading here; src/cluster/cluster.ts).
 */
import type { Cluster } from '../cluster/cluster.ts'
import type { AckStatus } from '../dispatch/dispatcher.ts'
import { HookqError } from '../errors.ts'
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
  pull(opts: PullOptions, signal: AbortSignal): Promise<string[]>
}

/** The other owners of a group's partitions, as the forwarding layer found them. */
export interface PullElsewhere {
  /** Partitions owned here. */
  selfParts: number
  owners: PullSource[]
}

type Results = Promise<{ deliveryId: string; status: AckStatus }[]>

export class AckService {
  constructor(
    private readonly groups: GroupService,
    private readonly cluster: Pick<Cluster, 'hasGroup' | 'ack' | 'nack' | 'extend' | 'deliveryOf' | 'pull'>,
    private readonly metrics?: Pick<Metrics, 'acked'>,
  ) {}

  /** 404 for a group that does not exist; the dispatcher knows the running ones without a query. */
  private async requireGroup(group: string): Promise<void> {
    if (!this.cluster.hasGroup(group)) await this.groups.get(group)
  }

  /**
   * Leases a pull group's messages (contract "Pull delivery"): their envelopes, as JSON texts.
   * `signal`: the caller went away (nothing more is leased to it). `elsewhere`: the other broker
   * processes owning partitions of the group (src/http/forward.ts), asked at the same time.
   */
  async pull(group: string, opts: PullOptions, signal: AbortSignal, elsewhere?: PullElsewhere | null): Promise<string[]> {
    const delivery = this.cluster.deliveryOf(group) ?? (await this.groups.get(group)).delivery
    if (delivery !== 'pull')
      throw new HookqError('push_group', `group ${group} is a push group (delivery "push"): its messages are pushed to its consumers`)
    if (!elsewhere || elsewhere.owners.length === 0) return this.cluster.pull(group, opts, signal)
    return gather(opts, signal, [{ parts: elsewhere.selfParts, pull: (o, s) => this.cluster.pull(group, o, s) }, ...elsewhere.owners])
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
 * One pull over several owners: maxMessages split by the partitions each owns (so the answer never
 * holds more), all asked at once and without waiting first, their answers merged. Only when that
 * finds nothing and the caller would wait does a long poll go to every owner, the first answer
 * with messages ending the others' waits: a remote answer already under way is then cut off, and
 * what it leased expires and is retried as a failed attempt. Asking without waiting first keeps
 * those cut-offs to the moments when messages come to two owners at once during a wait; a long
 * poll of every owner from the start would cut off the others' leases at every pull with a backlog
 * (docs/walkthroughs.md, "A walk through pull delivery", says why this beats routing to one owner).
 */
async function gather(opts: PullOptions, signal: AbortSignal, sources: PullSource[]): Promise<string[]> {
  const total = sources.reduce((n, s) => n + s.parts, 0)
  let left = opts.maxMessages
  const shares = sources.map((s) => {
    const share = Math.min(left, Math.floor((opts.maxMessages * s.parts) / Math.max(1, total)))
    left -= share
    return share
  })
  shares[0]! += left // what the split rounded off: this process's
  const startedMs = performance.now()
  const now = await ask(sources, shares, { ...opts, waitMs: 0 }, signal, false)
  const waitMs = Math.max(0, opts.waitMs - Math.round(performance.now() - startedMs))
  if (now.length > 0 || waitMs === 0 || signal.aborted) return now
  // A long poll waits on every owner, at least one message each: the produce that wakes it may
  // come to any of them. Only when two owners answer at once can that lease more than the caller
  // takes: the extra ones are cut (below) and expire like the lease of a caller gone.
  return (
    await ask(
      sources,
      shares.map((n) => Math.max(1, n)),
      { ...opts, waitMs },
      signal,
      true,
    )
  ).slice(0, opts.maxMessages)
}

/** Each source asked for its share at once; `firstEnds`: the first answer with messages ends the others. */
async function ask(sources: PullSource[], shares: number[], opts: PullOptions, signal: AbortSignal, firstEnds: boolean): Promise<string[]> {
  const aborts = sources.map(() => new AbortController())
  const stopAll = () => {
    for (const a of aborts) a.abort()
  }
  signal.addEventListener('abort', stopAll, { once: true })
  try {
    const answers = await Promise.all(
      sources.map(async (s, i) => {
        if (shares[i]! === 0) return []
        const got = await s.pull({ ...opts, maxMessages: shares[i]! }, aborts[i]!.signal).catch(() => [] as string[])
        if (got.length > 0 && firstEnds) {
          for (const [k, a] of aborts.entries()) if (k !== i) a.abort()
        }
        return got
      }),
    )
    return answers.flat()
  } finally {
    signal.removeEventListener('abort', stopAll)
  }
}

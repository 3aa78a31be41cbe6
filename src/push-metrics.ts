/**
 * The two series every push touches, hookq_pushes_total and hookq_push_duration_seconds, kept in
 * plain numbers and handed to prom-client only when scraped. prom-client hashes the label values
 * on every inc and observe, even through a labelled child: 2-3% of the broker's CPU and a few
 * hundred bytes of garbage a push in bench:e2e (one push a message). Here a push is two additions
 * and a bucket search on an object found by group.
 */
import { Counter, type Registry } from 'prom-client'

/** How one push ended, as the pusher classifies it. */
export type PushOutcome = 'delivered' | 'rejected' | 'timeout' | 'network'

/** One group's counts: attempts by outcome not yet handed to the counter, and its duration histogram. */
interface GroupPushSeries {
  unreported: Record<PushOutcome, number>
  /** Observations per bucket (not cumulative); the last slot is beyond the largest bound. */
  buckets: Float64Array
  sum: number
  count: number
}

const OUTCOMES: readonly PushOutcome[] = ['delivered', 'rejected', 'timeout', 'network']

export class PushSeries {
  private readonly groups = new Map<string, GroupPushSeries>()

  constructor(
    registry: Registry,
    private readonly bounds: readonly number[],
  ) {
    const groups = this.groups
    // A counter of prom-client's own, brought up to date when scraped (collect).
    new Counter({
      name: 'hookq_pushes_total',
      help: 'Push attempts by how they ended',
      labelNames: ['group', 'outcome'] as const,
      registers: [registry],
      collect() {
        for (const [group, s] of groups)
          for (const outcome of OUTCOMES) {
            const n = s.unreported[outcome]
            if (n === 0) continue
            this.inc({ group, outcome }, n)
            s.unreported[outcome] = 0
          }
      },
    })
    // The histogram as prom-client's registry reads a metric: name, help, type and get().
    const name = 'hookq_push_duration_seconds'
    const histogram = {
      name,
      help: 'Duration of push HTTP calls',
      type: 'histogram',
      aggregator: 'sum',
      get: async () => ({
        name,
        help: histogram.help,
        type: 'histogram',
        aggregator: 'sum',
        values: [...groups].flatMap(([group, s]) => {
          const values: { labels: Record<string, string | number>; value: number; metricName: string }[] = []
          let cumulative = 0
          for (let i = 0; i < bounds.length; i++) {
            cumulative += s.buckets[i]!
            values.push({ labels: { le: bounds[i]!, group }, value: cumulative, metricName: `${name}_bucket` })
          }
          values.push({ labels: { le: '+Inf', group }, value: s.count, metricName: `${name}_bucket` })
          values.push({ labels: { group }, value: s.sum, metricName: `${name}_sum` })
          values.push({ labels: { group }, value: s.count, metricName: `${name}_count` })
          return values
        }),
      }),
      reset: () => {
        for (const s of groups.values()) {
          s.buckets.fill(0)
          s.sum = 0
          s.count = 0
        }
      },
    }
    registry.registerMetric(histogram as unknown as Parameters<Registry['registerMetric']>[0])
  }

  /** A push call of `group` ended with `outcome` after `seconds`, ending `messages` attempts. */
  pushed(group: string, outcome: PushOutcome, seconds: number, messages: number): void {
    const s = this.of(group)
    if (messages > 0) s.unreported[outcome] += messages
    if (!Number.isFinite(seconds)) return
    let i = 0
    while (i < this.bounds.length && seconds > this.bounds[i]!) i++
    s.buckets[i]!++
    s.sum += seconds
    s.count++
  }

  /** Attempts counted under `outcome` without a call of their own (a batch's failed members). */
  count(group: string, outcome: PushOutcome, messages: number): void {
    if (messages > 0) this.of(group).unreported[outcome] += messages
  }

  private of(group: string): GroupPushSeries {
    let s = this.groups.get(group)
    if (!s) {
      const unreported = { delivered: 0, rejected: 0, timeout: 0, network: 0 }
      this.groups.set(group, (s = { unreported, buckets: new Float64Array(this.bounds.length + 1), sum: 0, count: 0 }))
    }
    return s
  }
}

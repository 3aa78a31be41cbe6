/**
 * The broker's Prometheus metrics. Each broker has a registry of its own, not prom-client's global
 * one, so several brokers in one process (a test file) never register a name twice. Counters are
 * bumped where things happen (produce route, ack service, dispatcher). The per-partition gauges
 * are filled at scrape time: in flight from the dispatcher's memory, lag from a snapshot kept in
 * memory and refreshed in the background while someone scrapes (src/lag-snapshot.ts).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { LagSnapshot, Snapshot, type PartitionLag, type StorageStats } from './lag-snapshot.ts'
import { PushSeries, type PushOutcome } from './push-metrics.ts'

export type { PushOutcome }

/** One partition of one group, as the lag and in-flight gauges show it. */
export interface PartitionStat {
  group: string
  partition: number
  lag: number
  inFlight: number
}

/** What the dispatcher reports: each push, each redelivery, each dead letter. */
export interface DispatchMetrics {
  /**
   * A push call ended, `seconds` its HTTP duration, ending `messages` attempts (a batch's size;
   * default 1) with `outcome`.
   */
  pushed(group: string, outcome: PushOutcome, seconds: number, messages?: number): void
  /** Attempts a batch's 2xx answer listed in `failed` (its call is counted by pushed). */
  failedInBatch(group: string, messages: number): void
  /** A message is pushed again (attempt 2 or later). */
  redelivered(group: string): void
  /** A message was dead-lettered (to its dead-letter topic, or recorded as dead). */
  deadLettered(group: string): void
  /** A batch push went out carrying `size` messages. */
  batchSent(group: string, size: number): void
  /** A message was completed without a push: the group's filter did not match it. */
  filtered(group: string): void
  /** Pushes to a consumer of the group waited for its rate limit (once per wait, not per message). */
  rateLimited(group: string): void
}

/** One consumer's push window, as its gauges show it. */
export interface PushWindowStat {
  consumerId: string
  limit: number
  inFlight: number
}

/** How old the lag gauges may grow while scraped, unless the broker says (HOOKQ_METRICS_REFRESH_MS). */
const DEFAULT_LAG_REFRESH_MS = 5000
/** Sizes and oldest rows change slowly: read no more often than this, whatever the lag's refresh. */
const MIN_STORAGE_REFRESH_MS = 15_000
const NO_STORAGE: StorageStats = { tables: [], topics: [], oldestAttemptMs: null }

// Seconds: from a fast local endpoint (a few ms) to the largest push timeout worth a bucket (60 s).
const PUSH_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

/** A group's push counter for one outcome, and its duration histogram. */
/** The metrics of one broker, with typed methods for every event counted. */
export class Metrics implements DispatchMetrics {
  /** What GET /metrics serves: these metrics plus the process's default ones. */
  readonly registry = new Registry()
  private readonly producedTotal = new Counter({
    name: 'hookq_messages_produced_total',
    help: 'Messages stored by produce (duplicates not counted)',
    labelNames: ['topic'] as const,
    registers: [this.registry],
  })
  /** hookq_pushes_total and hookq_push_duration_seconds, counted without prom-client per push (see push-metrics.ts). */
  private readonly pushes = new PushSeries(this.registry, PUSH_BUCKETS_S)
  private readonly acksTotal = new Counter({
    name: 'hookq_acks_total',
    help: 'Delivery ids in ack, nack and extend calls, by the status answered',
    labelNames: ['group', 'status'] as const,
    registers: [this.registry],
  })
  private readonly redeliveriesTotal = new Counter({
    name: 'hookq_redeliveries_total',
    help: 'Pushes of a message after its first attempt',
    labelNames: ['group'] as const,
    registers: [this.registry],
  })
  private readonly deadLettersTotal = new Counter({
    name: 'hookq_dead_letters_total',
    help: 'Messages dead-lettered',
    labelNames: ['group'] as const,
    registers: [this.registry],
  })
  private readonly filteredTotal = new Counter({
    name: 'hookq_filtered_total',
    help: "Messages completed without a push: the group's filter did not match them",
    labelNames: ['group'] as const,
    registers: [this.registry],
  })
  private readonly filteredSeries = new Map<string, { inc(): void }>()
  private readonly batchSize = new Histogram({
    name: 'hookq_batch_size',
    help: 'Messages per batch push',
    labelNames: ['group'] as const,
    buckets: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
    registers: [this.registry],
  })
  private readonly outboxSetAsideTotal = new Counter({
    name: 'hookq_outbox_set_aside_total',
    help: 'Rows of the produce outbox this process could not move and set aside in produce_outbox_set_aside (the log names each outbox id)',
    registers: [this.registry],
  })
  private readonly rateLimitedTotal = new Counter({
    name: 'hookq_rate_limited_waits_total',
    help: 'Times pushes to a consumer waited for its rateLimitPerSecond',
    labelNames: ['group'] as const,
    registers: [this.registry],
  })
  private lags: LagSnapshot
  private readonly outbox: Snapshot<number | undefined>
  private storage: Snapshot<StorageStats>
  private inFlightOf: (groupId: number, partition: number) => number = () => 0
  private windowSource: () => PushWindowStat[] = () => []
  private pullsWaitingSource: () => number = () => 0
  private outboxSource: () => Promise<number> = async () => 0
  private snapshot: Promise<PartitionStat[]> | undefined

  /**
   * `onError` hears of a failed read (the gauges it feeds are then left empty); `lagRefreshMs` is
   * how old the lag gauges may grow while scraped.
   */
  constructor(
    private readonly onError: (err: unknown) => void = () => {},
    private readonly lagRefreshMs = DEFAULT_LAG_REFRESH_MS,
  ) {
    this.lags = new LagSnapshot({ read: async () => [], refreshMs: lagRefreshMs, onError })
    this.storage = this.storageSnapshot(async () => NO_STORAGE)
    collectDefaultMetrics({ register: this.registry })
    const stats = () => this.partitionStats()
    const gauge = (name: string, help: string, pick: (s: PartitionStat) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ['group', 'partition'] as const,
        registers: [this.registry],
        async collect() {
          const rows = await stats()
          // Reset first: a deleted group's partitions must disappear, not keep their last value.
          this.reset()
          for (const s of rows) this.set({ group: s.group, partition: String(s.partition) }, pick(s))
        },
      })
    gauge('hookq_in_flight', 'Messages outstanding (pushed, or waiting for a retry) per group partition', (s) => s.inFlight)
    gauge('hookq_lag', 'End offset minus committed offset per group partition', (s) => s.lag)
    const windows = () => this.windowSource()
    const windowGauge = (name: string, help: string, pick: (w: PushWindowStat) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ['consumer'] as const,
        registers: [this.registry],
        collect() {
          this.reset()
          for (const w of windows()) this.set({ consumer: w.consumerId }, pick(w))
        },
      })
    windowGauge(
      'hookq_push_window',
      'Pushes allowed at once to a consumer (grows while it keeps up, halves when it struggles)',
      (w) => w.limit,
    )
    windowGauge('hookq_pushes_in_flight', 'Push HTTP calls under way to a consumer', (w) => w.inFlight)
    // Read in the background like the lag, not at each scrape: a scrape costs the database nothing.
    this.outbox = new Snapshot<number | undefined>({
      read: () => this.outboxSource(),
      empty: undefined,
      refreshMs: lagRefreshMs,
      onError,
    })
    const outbox = () => this.outbox.forScrape()
    new Gauge({
      name: 'hookq_outbox_oldest_seconds',
      registers: [this.registry],
      help: 'Age of the oldest message hookq_produce() committed that is not in its topic yet (0: none waiting)',
      async collect() {
        this.reset()
        const seconds = await outbox()
        if (seconds !== undefined) this.set(seconds) // a failed read: left out
      },
    })
    const pullsWaiting = () => this.pullsWaitingSource()
    new Gauge({
      name: 'hookq_pulls_waiting',
      help: 'Pull calls with waitMs (forwarded probes included) waiting on this process; past HOOKQ_MAX_WAITING_PULLS more are answered 429',
      registers: [this.registry],
      collect() {
        this.set(pullsWaiting())
      },
    })
    this.storageGauges()
  }

  /** The storage gauges: table sizes, messages kept and the oldest rows, per table and topic. */
  private storageGauges(): void {
    const stats = () => this.storage.forScrape()
    const now = () => Date.now()
    new Gauge({
      name: 'hookq_table_bytes',
      help: 'Disk taken by a table hookq writes as traffic comes, with its indexes and TOAST (all its partitions)',
      labelNames: ['table'] as const,
      registers: [this.registry],
      async collect() {
        const s = await stats()
        this.reset()
        for (const t of s.tables) this.set({ table: t.table }, t.bytes)
      },
    })
    new Gauge({
      name: 'hookq_table_dead_rows',
      help: 'Row versions of a hot table deleted or updated but not yet vacuumed (n_dead_tup)',
      labelNames: ['table'] as const,
      registers: [this.registry],
      async collect() {
        const s = await stats()
        this.reset()
        for (const t of s.tables) this.set({ table: t.table }, t.deadRows)
      },
    })
    const topicGauge = (name: string, help: string, pick: (t: StorageStats['topics'][number]) => number | null) =>
      new Gauge({
        name,
        help,
        labelNames: ['topic'] as const,
        registers: [this.registry],
        async collect() {
          const s = await stats()
          this.reset()
          for (const t of s.topics) {
            const v = pick(t)
            if (v !== null) this.set({ topic: t.topic }, v)
          }
        },
      })
    topicGauge('hookq_topic_messages', 'Messages a topic keeps (its partitions from the oldest offset kept to the end)', (t) => t.messages)
    topicGauge(
      'hookq_topic_bytes',
      "A topic's share of the messages table: its messages kept times the table's bytes per message",
      (t) => t.approxBytes,
    )
    // Ages, not timestamps, computed at scrape time: they grow between reads as the rows do.
    topicGauge('hookq_topic_oldest_message_seconds', 'Age of the oldest message a topic keeps (absent: none kept)', (t) =>
      t.oldestMs === null ? null : Math.max(0, (now() - t.oldestMs) / 1000),
    )
    new Gauge({
      name: 'hookq_attempt_log_oldest_seconds',
      help: 'Age of the oldest attempt the attempt log keeps (absent: none)',
      registers: [this.registry],
      async collect() {
        const s = await stats()
        this.reset()
        if (s.oldestAttemptMs !== null) this.set(Math.max(0, (now() - s.oldestAttemptMs) / 1000))
      },
    })
  }

  private storageSnapshot(read: () => Promise<StorageStats>): Snapshot<StorageStats> {
    return new Snapshot({
      read,
      empty: NO_STORAGE,
      what: 'reading the sizes of the hot tables',
      refreshMs: Math.max(this.lagRefreshMs, MIN_STORAGE_REFRESH_MS),
      onError: this.onError,
    })
  }

  /** Sets where the storage gauges come from (read in the background while scraped, at most every 15 s). */
  trackStorage(read: () => Promise<StorageStats>): void {
    this.storage.close()
    this.storage = this.storageSnapshot(read)
  }

  private readonly ownedGauge = new Gauge({
    name: 'hookq_partitions_owned',
    help: 'Group partitions this process pushes (owns among the broker processes of its database)',
    registers: [this.registry],
  })

  /** This process owns `count` group partitions now. */
  owned(count: number): void {
    this.ownedGauge.set(count)
  }

  /** Sets where the push-window gauges come from (the dispatcher's windows, read at scrape time). */
  trackPushWindows(source: () => PushWindowStat[]): void {
    this.windowSource = source
  }

  /** Sets where the waiting-pulls gauge comes from (the long polls under way on this process, read at scrape time). */
  trackPullsWaiting(source: () => number): void {
    this.pullsWaitingSource = source
  }

  /** Sets where the outbox gauge comes from: the oldest waiting row's age, s (read once per scrape). */
  trackOutbox(source: () => Promise<number>): void {
    this.outboxSource = source
  }

  /**
   * Sets where the lag and in-flight gauges come from: `readLags` reads every group partition's lag
   * (in the background, at most once per lagRefreshMs while scraped), `inFlight` is asked at each scrape.
   */
  trackPartitions(readLags: () => Promise<PartitionLag[]>, inFlight: (groupId: number, partition: number) => number): void {
    this.lags.close()
    this.lags = new LagSnapshot({ read: readLags, refreshMs: this.lagRefreshMs, onError: this.onError })
    this.inFlightOf = inFlight
  }

  /** Stops the lag and storage gauges' background reads. */
  close(): void {
    this.lags.close()
    this.outbox.close()
    this.storage.close()
  }

  /** The Prometheus text exposition and its content type. */
  async exposition(): Promise<{ contentType: string; text: string }> {
    return { contentType: this.registry.contentType, text: await this.registry.metrics() }
  }

  /** `n` messages were stored on a topic. */
  produced(topic: string, n: number): void {
    if (n > 0) this.producedTotal.inc({ topic }, n)
  }

  /** A produce outbox row could not be moved and was set aside. */
  outboxSetAside(): void {
    this.outboxSetAsideTotal.inc()
  }

  /** An ack, nack or extend answered `status` for one delivery id. */
  acked(group: string, status: string): void {
    this.acksTotal.inc({ group, status })
  }

  pushed(group: string, outcome: PushOutcome, seconds: number, messages = 1): void {
    this.pushes.pushed(group, outcome, seconds, messages)
  }

  failedInBatch(group: string, messages: number): void {
    this.pushes.count(group, 'rejected', messages)
  }

  redelivered(group: string): void {
    this.redeliveriesTotal.inc({ group })
  }

  deadLettered(group: string): void {
    this.deadLettersTotal.inc({ group })
  }

  batchSent(group: string, size: number): void {
    this.batchSize.observe({ group }, size)
  }

  filtered(group: string): void {
    // Kept per group, as the push series are: one call per filtered message.
    let series = this.filteredSeries.get(group)
    if (!series) this.filteredSeries.set(group, (series = this.filteredTotal.labels({ group })))
    series.inc()
  }

  rateLimited(group: string): void {
    this.rateLimitedTotal.inc({ group })
  }

  /** Both gauges collect in the same scrape: they share one look at the lag snapshot. */
  private partitionStats(): Promise<PartitionStat[]> {
    if (this.snapshot) return this.snapshot
    this.snapshot = this.lags
      .forScrape()
      .then((rows) =>
        rows.map((r) => ({ group: r.group, partition: r.partition, lag: r.lag, inFlight: this.inFlightOf(r.groupId, r.partition) })),
      )
      .finally(() => {
        this.snapshot = undefined
      })
    return this.snapshot
  }
}

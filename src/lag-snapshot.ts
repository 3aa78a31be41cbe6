/**
 * The lag of every group partition as the /metrics gauges serve it: read from the store in one
 * statement for all groups and kept in memory, so a scrape costs the database nothing and takes the
 * same time with 10 groups or 10,000 (reading each group's offsets at every scrape took 3 s for
 * 2,000 groups; see docs/performance.md).
 *
 * A scrape serves the last read at once. While someone scrapes, the rows are read again every
 * refreshMs in the background, one read at a time; once no scrape has come for IDLE_AFTER_MS the
 * reading stops, and the next scrape starts it again (serving what it has meanwhile). Only the
 * first scrape of a broker waits, up to READ_TIMEOUT_MS, for the first read: an empty answer
 * would read as "no groups". A failed read leaves the gauges empty rather than stale.
 * The storage gauges (table sizes, oldest rows kept) are served the same way, by a Snapshot of
 * their own that reads less often.
 */
import type { PartitionLag } from './store/groups.ts'
import type { StorageStats } from './store/storage.ts'

export type { PartitionLag, StorageStats }

/** A read taking longer than this is given up (a database cut off must not stop reads for good). */
const READ_TIMEOUT_MS = 3000
/** Reading stops when no scrape has come for this long (Prometheus scrapes every 15 s to 1 min). */
const IDLE_AFTER_MS = 5 * 60_000

export interface SnapshotOptions<T> {
  /** One read of everything the gauges show (every group partition's lag). */
  read: () => Promise<T>
  /** What is served before the first read, and after a failed one. */
  empty: T
  /** What a read is, for the error of one that takes too long. */
  what?: string
  /** How old the rows may grow while someone scrapes (HOOKQ_METRICS_REFRESH_MS). */
  refreshMs: number
  /** Hears of a failed or timed-out read. */
  onError: (err: unknown) => void
  now?: () => number
}

/** Rows read in the background while someone scrapes, served from memory. */
export class Snapshot<T> {
  private rows: T
  private readAtMs = -Infinity
  private lastScrapeMs = -Infinity
  private reading: Promise<void> | undefined
  private timer: NodeJS.Timeout | undefined
  private closed = false
  private readonly now: () => number

  constructor(private readonly opts: SnapshotOptions<T>) {
    this.now = opts.now ?? Date.now
    this.rows = opts.empty
  }

  /** The rows to serve for a scrape: the last read's (the first scrape waits for the first read). */
  async forScrape(): Promise<T> {
    this.lastScrapeMs = this.now()
    // Stale (after a quiet spell no timer runs): read again, and serve the last rows meanwhile.
    if (this.now() - this.readAtMs >= this.opts.refreshMs) this.refresh()
    if (this.readAtMs === -Infinity && this.reading) await this.reading
    return this.rows
  }

  /** Stops the background reads (the broker is closing). */
  close(): void {
    this.closed = true
    clearTimeout(this.timer)
    this.timer = undefined
  }

  private refresh(): void {
    if (this.reading || this.closed) return
    clearTimeout(this.timer)
    this.timer = undefined
    this.reading = withinTimeout(this.opts.read(), this.opts.what ?? 'reading the lag of every group', READ_TIMEOUT_MS)
      .then(
        (rows) => {
          this.rows = rows
        },
        (err: unknown) => {
          this.rows = this.opts.empty
          this.opts.onError(err)
        },
      )
      .finally(() => {
        this.readAtMs = this.now()
        this.reading = undefined
        this.schedule()
      })
  }

  /** The next background read, while someone has scraped lately. */
  private schedule(): void {
    if (this.closed || this.now() - this.lastScrapeMs > IDLE_AFTER_MS) return
    this.timer = setTimeout(() => {
      this.timer = undefined
      this.refresh()
    }, this.opts.refreshMs)
    this.timer.unref()
  }
}

export type LagSnapshotOptions = Omit<SnapshotOptions<PartitionLag[]>, 'empty'>

/** Every group partition's lag. */
export class LagSnapshot extends Snapshot<PartitionLag[]> {
  constructor(opts: LagSnapshotOptions) {
    super({ ...opts, empty: [] })
  }
}

/** `read`, or a rejection naming `what` once it takes over `timeoutMs` (a scrape must not hang on the database). */
export async function withinTimeout<T>(read: Promise<T>, what: string, timeoutMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took over ${timeoutMs} ms`)), timeoutMs)
  })
  try {
    return await Promise.race([read, deadline])
  } finally {
    clearTimeout(timer)
  }
}

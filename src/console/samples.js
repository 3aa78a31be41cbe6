// @ts-check
/**
 * What the console remembers between polls, in memory for the life of the tab: offset samples per
 * topic (for msg/s) and per group (for the lag and throughput chart). Pure data, no DOM, no timers:
 * callers pass the sample time.
 */

/** How long samples are kept: the chart shows the last 10 minutes. */
export const HISTORY_MS = 10 * 60_000
/** The span a throughput figure in a table averages over. */
export const RATE_WINDOW_MS = 10_000
/** How often views poll the broker. */
export const POLL_MS = 2_000

/**
 * A series of (time, counter) samples of one growing counter, e.g. a topic's summed end offsets.
 */
export class CounterSeries {
  constructor() {
    /** @type {number[]} */ this.timesMs = []
    /** @type {number[]} */ this.values = []
  }

  /** Adds a sample and forgets those older than HISTORY_MS. @param {number} tMs @param {number} value */
  push(tMs, value) {
    this.timesMs.push(tMs)
    this.values.push(value)
    let drop = 0
    while (drop < this.timesMs.length - 1 && /** @type {number} */ (this.timesMs[drop]) < tMs - HISTORY_MS) drop++
    if (drop > 0) {
      this.timesMs.splice(0, drop)
      this.values.splice(0, drop)
    }
  }

  /**
   * The counter's growth a second over the last `windowMs` (at least two samples apart), or null
   * before there are two samples. A counter that went down (a seek) counts as no growth.
   * @param {number} [windowMs]
   */
  rate(windowMs = RATE_WINDOW_MS) {
    const n = this.timesMs.length
    if (n < 2) return null
    const lastT = /** @type {number} */ (this.timesMs[n - 1])
    let i = n - 2
    while (i > 0 && /** @type {number} */ (this.timesMs[i - 1]) >= lastT - windowMs) i--
    const dtMs = lastT - /** @type {number} */ (this.timesMs[i])
    if (dtMs <= 0) return null
    const last = /** @type {number} */ (this.values[n - 1])
    const first = /** @type {number} */ (this.values[i])
    return Math.max(0, ((last - first) * 1000) / dtMs)
  }
}

/**
 * A group's history for the chart: per sample the total lag, and messages a second produced to the
 * topic (end offsets) and completed by the group (committed offsets) since the sample before.
 */
export class GroupHistory {
  constructor() {
    /** @type {number[]} seconds, as uPlot wants them */ this.times = []
    /** @type {number[]} */ this.lag = []
    /** @type {(number | null)[]} */ this.producedPerS = []
    /** @type {(number | null)[]} */ this.completedPerS = []
    /** @type {{ tMs: number, end: number, committed: number } | null} */ this.last = null
  }

  /**
   * @param {number} tMs
   * @param {{ endOffset: number, committedOffset: number, lag: number }[]} partitions
   */
  push(tMs, partitions) {
    const end = partitions.reduce((s, p) => s + p.endOffset, 0)
    const committed = partitions.reduce((s, p) => s + p.committedOffset, 0)
    const lag = partitions.reduce((s, p) => s + p.lag, 0)
    const prev = this.last
    const dtS = prev ? (tMs - prev.tMs) / 1000 : 0
    this.times.push(tMs / 1000)
    this.lag.push(lag)
    // Rates need an interval; a seek moves committed offsets back, which is not negative work.
    this.producedPerS.push(prev && dtS > 0 ? Math.max(0, (end - prev.end) / dtS) : null)
    this.completedPerS.push(prev && dtS > 0 ? Math.max(0, (committed - prev.committed) / dtS) : null)
    this.last = { tMs, end, committed }
    let drop = 0
    while (drop < this.times.length - 1 && /** @type {number} */ (this.times[drop]) < (tMs - HISTORY_MS) / 1000) drop++
    if (drop > 0) for (const a of [this.times, this.lag, this.producedPerS, this.completedPerS]) a.splice(0, drop)
  }

  /** The columns in uPlot's order: x, lag, produced, completed. @returns {import('uplot').AlignedData} */
  data() {
    return [this.times, this.lag, this.producedPerS, this.completedPerS]
  }
}

/** @type {Map<string, CounterSeries>} */
const topicSeries = new Map()
/** @type {Map<string, GroupHistory>} */
const groupHistories = new Map()

/** The end-offset series of a topic, created on first use. @param {string} topic */
export function topicCounter(topic) {
  let s = topicSeries.get(topic)
  if (!s) topicSeries.set(topic, (s = new CounterSeries()))
  return s
}

/** The chart history of a group, created on first use. @param {string} group */
export function groupHistory(group) {
  let s = groupHistories.get(group)
  if (!s) groupHistories.set(group, (s = new GroupHistory()))
  return s
}

/**
 * Runs `fn` now and every `everyMs` until the returned stop is called; a run never overlaps the
 * one before (a slow broker gets fewer polls, not a pile of them).
 * @param {() => Promise<void>} fn
 * @param {number} [everyMs]
 */
export function poll(fn, everyMs = POLL_MS) {
  let stopped = false
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer
  const run = async () => {
    try {
      await fn()
    } catch {
      /* the view shows its own errors */
    }
    if (!stopped) timer = setTimeout(run, everyMs)
  }
  void run()
  return () => {
    stopped = true
    clearTimeout(timer)
  }
}

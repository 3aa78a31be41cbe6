/**
 * Whether the CPU is busy: the progress writer's linger waits for company only then (progress.ts).
 * A wait trades latency, and the maxInFlight slots held meanwhile, for fewer statements; fewer
 * statements pay only when CPU is what runs out. With CPU to spare, writing at once moves more
 * messages through the same slots.
 *
 * Busy means the machine's CPUs (PostgreSQL on the same host counts; so do processes waiting for a
 * core on an oversubscribed one, which this process's own event loop would read as idle) or this
 * process's event loop were busy over the last window: from `enter` up, and until below `leave`
 * again, so that the waits it turns on (which lower the load) do not turn it off again at once. A
 * PostgreSQL on another host is not seen: its load shows as slower statements, and one statement
 * runs at a time, so a slower one gathers more company by itself.
 *
 * Read lazily, at most once a window, on the writer's own calls: no timer, nothing done while idle.
 * On Linux from the summary line of /proc/stat (one small read); elsewhere from os.cpus().
 */
import { closeSync, openSync, readSync } from 'node:fs'
import { cpus } from 'node:os'
import { performance, type EventLoopUtilization } from 'node:perf_hooks'

export interface CpuLoadOptions {
  /** Utilisation (0-1) from which the CPU counts as busy. */
  enter: number
  /** Utilisation below which busy CPU counts as free again. */
  leave: number
  /** The shortest window a reading covers, ms. */
  windowMs: number
}

/**
 * Busy from `percent` (HOOKQ_LINGER_CPU_PERCENT, 90 by default: below it the machine has a tenth of
 * its CPU or more to spare), free again 10 points lower. 250 ms: /proc/stat counts in 10 ms ticks,
 * so a reading on two cores moves in 2% steps.
 */
export function cpuLoadAt(percent: number): CpuLoadOptions {
  return { enter: percent / 100, leave: Math.max(0, percent - 10) / 100, windowMs: 250 }
}

export const DEFAULT_CPU_LOAD: CpuLoadOptions = cpuLoadAt(90)

/** Busy and idle CPU time of the whole machine so far, summed over its cores, in any one unit. */
export interface CpuTimes {
  busy: number
  idle: number
}

export interface CpuLoadDeps {
  now?: () => number
  /** The machine's CPU times (tests give their own). */
  machine?: () => CpuTimes
  /** performance.eventLoopUtilization's contract. */
  eventLoop?: (a?: EventLoopUtilization, b?: EventLoopUtilization) => EventLoopUtilization
}

export class CpuLoad {
  private readonly now: () => number
  private readonly machine: () => CpuTimes
  private readonly eventLoop: (a?: EventLoopUtilization, b?: EventLoopUtilization) => EventLoopUtilization
  private lastAt: number
  private lastTimes: CpuTimes
  private lastLoop: EventLoopUtilization
  private wasBusy = false

  constructor(
    private readonly options: CpuLoadOptions = DEFAULT_CPU_LOAD,
    deps: CpuLoadDeps = {},
  ) {
    this.now = deps.now ?? (() => performance.now())
    this.machine = deps.machine ?? machineTimes
    this.eventLoop = deps.eventLoop ?? ((a, b) => performance.eventLoopUtilization(a, b))
    this.lastAt = this.now()
    this.lastTimes = this.machine()
    this.lastLoop = this.eventLoop()
  }

  /** Whether the machine or this event loop is busy, as of the last reading (taken now if a window has passed). */
  busy(): boolean {
    const at = this.now()
    const since = at - this.lastAt
    if (since < this.options.windowMs) return this.wasBusy
    const times = this.machine()
    const loop = this.eventLoop()
    if (since > 10 * this.options.windowMs) {
      // The last reading is old: an average over a long quiet spell says nothing of now. Start a window.
      this.wasBusy = false
    } else {
      const busyTime = times.busy - this.lastTimes.busy
      const total = busyTime + (times.idle - this.lastTimes.idle)
      const load = Math.max(total > 0 ? busyTime / total : 0, this.eventLoop(loop, this.lastLoop).utilization)
      this.wasBusy = load >= (this.wasBusy ? this.options.leave : this.options.enter)
    }
    this.lastAt = at
    this.lastTimes = times
    this.lastLoop = loop
    return this.wasBusy
  }
}

const procStat = Buffer.alloc(512)

/** The machine's CPU times: Linux's summary line of /proc/stat, else os.cpus(). */
function machineTimes(): CpuTimes {
  if (process.platform === 'linux') {
    try {
      return procStatTimes()
    } catch {
      // No /proc (a sandbox): os.cpus() below.
    }
  }
  let busy = 0
  let idle = 0
  for (const { times } of cpus()) {
    busy += times.user + times.nice + times.sys + times.irq
    idle += times.idle
  }
  return { busy, idle }
}

/**
 * "cpu  user nice system idle iowait irq softirq steal ...", in ticks. Waiting for I/O is idle (a
 * core free to run something else); softirq (the network) and steal (a hypervisor's other guests)
 * are busy.
 */
function procStatTimes(): CpuTimes {
  const fd = openSync('/proc/stat', 'r')
  let n: number
  try {
    n = readSync(fd, procStat, 0, procStat.length, 0)
  } finally {
    closeSync(fd)
  }
  const line = procStat.toString('latin1', 0, n)
  const end = line.indexOf('\n')
  const f = line
    .slice(0, end < 0 ? n : end)
    .trim()
    .split(/\s+/)
  if (f[0] !== 'cpu' || f.length < 5) throw new Error('unexpected /proc/stat')
  const v = (i: number) => Number(f[i] ?? 0) || 0
  return { busy: v(1) + v(2) + v(3) + v(6) + v(7) + v(8), idle: v(4) + v(5) }
}

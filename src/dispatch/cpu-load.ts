/**
 * Whether the CPU is busy: the progress writer's linger waits for company only then (progress.ts).
 * A wait trades latency, and a maxInFlight slot held meanwhile, for fewer statements; fewer
 * statements only pay when CPU is what runs out. With CPU to spare, writing at once moves more
 * messages for the same slots.
 *
 * Busy means the machine's CPUs (all cores, from os.cpus(): PostgreSQL on the same host counts) or
 * this process's event loop (a broker held to less than a core by a container's quota) were at
 * least `threshold` utilised over the last window. Read lazily, at most once a window, on the
 * writer's own calls: no timer, nothing done while idle.
 */
import { cpus } from 'node:os'
import { performance, type EventLoopUtilization } from 'node:perf_hooks'

export interface CpuLoadOptions {
  /** Utilisation (0-1) from which the CPU counts as busy. */
  threshold: number
  /** The shortest window a reading covers, ms. */
  windowMs: number
}

export const DEFAULT_CPU_LOAD: CpuLoadOptions = { threshold: 0.9, windowMs: 100 }

/** Busy and idle CPU time of the whole machine so far, ms, summed over its cores. */
export interface CpuTimes {
  busy: number
  idle: number
}

export interface CpuLoadDeps {
  now?: () => number
  /** The machine's CPU times (tests give their own). */
  machine?: () => CpuTimes
  /** This event loop's utilisation since `since` (performance.eventLoopUtilization's contract). */
  eventLoop?: (since?: EventLoopUtilization) => EventLoopUtilization
}

export class CpuLoad {
  private readonly now: () => number
  private readonly machine: () => CpuTimes
  private readonly eventLoop: (since?: EventLoopUtilization) => EventLoopUtilization
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
    this.eventLoop = deps.eventLoop ?? ((since) => performance.eventLoopUtilization(since))
    this.lastAt = this.now()
    this.lastTimes = this.machine()
    this.lastLoop = this.eventLoop()
  }

  /** True when the machine or this event loop was at least `threshold` busy over the last reading's window. */
  busy(): boolean {
    const at = this.now()
    if (at - this.lastAt < this.options.windowMs) return this.wasBusy
    const times = this.machine()
    const loop = this.eventLoop()
    const busy = times.busy - this.lastTimes.busy
    const total = busy + (times.idle - this.lastTimes.idle)
    const machine = total > 0 ? busy / total : 0
    const ownLoop = this.eventLoop(this.lastLoop).utilization
    this.wasBusy = Math.max(machine, ownLoop) >= this.options.threshold
    this.lastAt = at
    this.lastTimes = times
    this.lastLoop = loop
    return this.wasBusy
  }
}

function machineTimes(): CpuTimes {
  let busy = 0
  let idle = 0
  for (const { times } of cpus()) {
    busy += times.user + times.nice + times.sys + times.irq
    idle += times.idle
  }
  return { busy, idle }
}

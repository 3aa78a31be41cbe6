/**
 * The measurement window of a load worker: it opens after `warmupS`, closes after `measureS` (or
 * earlier, when the worker reaches its count bound and calls end()), and takes the CPU of the
 * broker, PostgreSQL and this process over exactly that span.
 */
import { cpuSince, cpuSnapshot, type CpuSnapshot, type CpuWindow } from './proc.ts'

export class MeasureWindow {
  /** Inside the window: count what happens now. */
  measuring = false
  /** The window has closed: loops stop. */
  ended = false
  private start: CpuSnapshot | undefined
  private window: CpuWindow | undefined
  private readonly brokerPid: number | undefined

  /** `onEnd` runs once, when the window closes (stop the load there). */
  constructor(
    opts: { warmupS: number; measureS: number; brokerPid?: number | undefined },
    private readonly onEnd: () => void = () => {},
  ) {
    this.brokerPid = opts.brokerPid
    setTimeout(() => {
      this.start = cpuSnapshot(opts.brokerPid)
      this.measuring = true
      setTimeout(() => this.end(), opts.measureS * 1000)
    }, opts.warmupS * 1000)
  }

  /** Closes the window now (a count bound reached); idempotent. */
  end(): void {
    if (!this.measuring) return
    this.measuring = false
    this.ended = true
    this.window = cpuSince(this.start!, this.brokerPid)
    this.onEnd()
  }

  /** The CPU over the window; throws if it never opened. */
  cpu(): CpuWindow {
    if (this.window === undefined) throw new Error('the run ended before its measurement window began')
    return this.window
  }
}

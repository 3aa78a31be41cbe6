export interface CpuReading {
  wall: number
  self: number
  children: number
}

/** Wall and CPU seconds so far: this process's (user + sys), and its reaped children's (brokers, CLIs). */
export function cpuNow(): CpuReading

/** Appends `file`'s line: what was spent between `from` and `to` (cpuNow readings); `group`: the group it ran in. */
export function logCpu(log: string, file: string, from: CpuReading, to: CpuReading, group?: string): void

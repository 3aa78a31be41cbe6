// The lines HOOKQ_TEST_CPU_LOG=<file> collects (scripts/test-process.mjs for each test process,
// test/helpers/group.ts for each file of a group; `node scripts/test-cpu.mjs <file>` reads them).
import { appendFileSync, readFileSync } from 'node:fs'

/** Wall and CPU seconds so far: this process's (user + sys), and its reaped children's (brokers, CLIs). */
export function cpuNow() {
  const stat = readFileSync('/proc/self/stat', 'utf8')
  // After the command's ')': state is field 3, utime 14, stime 15, cutime 16, cstime 17 (proc(5)).
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  const tick = 100
  return {
    wall: performance.now() / 1000,
    self: (Number(f[11]) + Number(f[12])) / tick,
    children: (Number(f[13]) + Number(f[14])) / tick,
  }
}

/** Appends `file`'s line: what was spent between `from` and `to` (cpuNow readings); `group`: the group it ran in. */
export function logCpu(log, file, from, to, group) {
  const d = (k) => (to[k] - from[k]).toFixed(1)
  appendFileSync(log, `${file}\t${d('wall')}\t${d('self')}\t${d('children')}${group ? `\t${group}` : ''}\n`)
}

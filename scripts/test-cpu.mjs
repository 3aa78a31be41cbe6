// `node scripts/test-cpu.mjs <log>`: the lines a run with HOOKQ_TEST_CPU_LOG=<log> wrote (see
// scripts/test-process.mjs), file by file, most CPU first, with the totals. A file run in a group
// (test/helpers/group.ts) has a line of its own, marked with its group, and is counted in its
// group's process line: the totals add up the processes.
import { readFileSync } from 'node:fs'

const rows = readFileSync(process.argv[2], 'utf8')
  .trim()
  .split('\n')
  .map((line) => {
    const [file, wall, self, children, group] = line.split('\t')
    return { file, wall: Number(wall), self: Number(self), children: Number(children), group }
  })
rows.sort((a, b) => b.self + b.children - (a.self + a.children))
const processes = rows.filter((r) => !r.group)
const sum = (k) => processes.reduce((s, r) => s + r[k], 0)
console.log('cpu s\tself\tchild\twall s\tfile')
for (const r of rows)
  console.log(
    `${(r.self + r.children).toFixed(1)}\t${r.self.toFixed(1)}\t${r.children.toFixed(1)}\t${r.wall.toFixed(1)}\t${r.file}${r.group ? ` (in ${r.group})` : ''}`,
  )
console.log(
  `${(sum('self') + sum('children')).toFixed(0)}\t${sum('self').toFixed(0)}\t${sum('children').toFixed(0)}\t${sum('wall').toFixed(0)}\t${processes.length} processes`,
)

// `node scripts/test-cpu.mjs <log>`: the lines a run with HOOKQ_TEST_CPU_LOG=<log> wrote (see
// scripts/test-process.mjs), file by file, most CPU first, with the totals.
import { readFileSync } from 'node:fs'

const rows = readFileSync(process.argv[2], 'utf8')
  .trim()
  .split('\n')
  .map((line) => {
    const [file, wall, self, children] = line.split('\t')
    return { file, wall: Number(wall), self: Number(self), children: Number(children) }
  })
rows.sort((a, b) => b.self + b.children - (a.self + a.children))
const sum = (k) => rows.reduce((s, r) => s + r[k], 0)
console.log('cpu s\tself\tchild\twall s\tfile')
for (const r of rows)
  console.log(`${(r.self + r.children).toFixed(1)}\t${r.self.toFixed(1)}\t${r.children.toFixed(1)}\t${r.wall.toFixed(1)}\t${r.file}`)
console.log(
  `${(sum('self') + sum('children')).toFixed(0)}\t${sum('self').toFixed(0)}\t${sum('children').toFixed(0)}\t${sum('wall').toFixed(0)}\t${rows.length} files`,
)

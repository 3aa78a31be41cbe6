/**
 * Top self-time functions and modules of a .cpuprofile, e.g. the broker's from
 * `BENCH_CPU_PROF=1 npm run bench:produce`:
 *   node --import tsx bench/profile-top.ts [file.cpuprofile] [topN]
 * Without a file, takes the newest main-thread profile in bench/out.
 */
import { readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { ROOT } from './lib/child.ts'
import { formatSummary, summarizeProfile } from './lib/cpuprofile.ts'

let file = process.argv[2] || undefined
if (file === undefined) {
  const dir = join(ROOT, 'bench/out')
  const newest = readdirSync(dir)
    .filter((f) => /\.\d+\.0\.\d+\.cpuprofile$/.test(f)) // thread 0: not tsx's loader thread
    .map((f) => join(dir, f))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0]
  if (newest === undefined) throw new Error(`no .cpuprofile in ${dir}`)
  file = newest
}
console.log(file)
console.log(formatSummary(summarizeProfile(file), Number(process.argv[3] ?? 25)))

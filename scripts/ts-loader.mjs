// `node --import=./scripts/ts-loader.mjs`: runs TypeScript as the test processes need it (tap's
// node-arg in package.json). Why not tsx, which the benches, the SDK's test consumers and a checkout
// without a bundle still use: tsx's hooks resolve and load every module of a process, packages'
// included, and patch require() as well. A test file that builds the app loads several hundred
// modules (fastify, Prisma's client, typebox's ~370 files); one such file took 4.5-4.7 s of CPU
// under tsx and 3.4-3.8 s with this hook (ts-loader-hooks.mjs), which compiles .ts files and leaves
// every other module to Node. (The whole suite's wall time barely moved: broker processes and
// waits dominate it. A single file while you work starts ~0.5 s sooner.)
import { readdirSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { register } from 'node:module'
import { join } from 'node:path'
import { CACHE_DIR } from './ts-loader-hooks.mjs'

register('./ts-loader-hooks.mjs', import.meta.url)

/** Compiled files older than this are removed (a file compiled again costs a few ms). */
const KEEP_MS = 7 * 24 * 3600_000
/** How often a process looks: one stat a process otherwise. */
const PRUNE_EVERY_MS = 24 * 3600_000

// Every edit leaves the file's former compilation behind: once a day, the old ones go.
const marker = join(CACHE_DIR, '.pruned')
const now = Date.now()
let due = false
try {
  due = now - statSync(marker).mtimeMs > PRUNE_EVERY_MS
} catch {
  due = true
}
if (due) {
  try {
    writeFileSync(marker, '')
    for (const name of readdirSync(CACHE_DIR)) {
      const p = join(CACHE_DIR, name)
      try {
        if (name !== '.pruned' && now - statSync(p).mtimeMs > KEEP_MS) rmSync(p, { force: true })
      } catch {}
    }
  } catch {
    // No cache folder yet: nothing to prune.
  }
}

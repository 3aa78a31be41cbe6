// The benchmarks' own packages (bench/package.json): the peers `npm run bench peers` runs beside
// hookq (graphile-worker, pg-boss, the RabbitMQ and NATS clients). They are not part
// of the project's `npm install`, which takes what running and testing hookq need; the benchmarks
// that use them install them here first, into bench/node_modules (`npm ci` on bench/package-lock.json),
// once, and again when that lock changes. `npm run bench:install` does it alone.
import { spawnSync } from 'node:child_process'
import { statSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const bench = fileURLToPath(new URL('../bench/', import.meta.url))
const modified = (file) => {
  try {
    return statSync(file).mtimeMs
  } catch {
    return -1
  }
}
// npm writes node_modules/.package-lock.json at the end of an install.
const installed = modified(join(bench, 'node_modules/.package-lock.json'))
if (installed < 0 || installed < modified(join(bench, 'package-lock.json'))) {
  console.error("bench: installing the benchmarks' own packages (bench/package.json)")
  const args = ['ci', '--prefix', bench, '--no-audit', '--no-fund']
  // Under `npm run`, the npm that runs us; else the one on PATH.
  const npm = process.env.npm_execpath
    ? spawnSync(process.execPath, [process.env.npm_execpath, ...args], { stdio: 'inherit' })
    : spawnSync('npm', args, { stdio: 'inherit', shell: process.platform === 'win32' })
  if (npm.status !== 0) {
    console.error('bench: the install failed; run `npm ci --prefix bench` to see why')
    process.exit(npm.status ?? 1)
  }
}

// After npm install / npm ci: generate the Prisma client, prepare what the first `npm start` would
// otherwise make, and rebuild tap's plugin set.
import { existsSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { cliBundle, serverBundle } from './server-bundle.mjs'

const generate = spawnSync(process.execPath, [fileURLToPath(new URL('./prisma-generate.mjs', import.meta.url))], { stdio: 'inherit' })
if (generate.status !== 0) process.exit(generate.status ?? 1)

// Best effort, each made by the first start (or CLI command) where it could not be made here: the
// bundles of the broker and the CLI (scripts/server-bundle.mjs; 4 s of a first start on a busy
// machine), and the embedded database's fresh cluster, so that a first start does not run
// PostgreSQL's initdb (src/store/embedded.ts says why). Both kept under node_modules/.cache/hookq.
try {
  await serverBundle()
  await cliBundle()
} catch (err) {
  console.warn(`hookq: the broker's bundle will be built at its first start: ${err instanceof Error ? err.message : err}`)
}
const fresh = spawnSync(
  process.execPath,
  ['--import', 'tsx', '--input-type=module', '-e', "await (await import('./src/store/embedded.ts')).freshClusterTar()"],
  { stdio: 'inherit', cwd: fileURLToPath(new URL('..', import.meta.url)) },
)
if (fresh.status !== 0) console.warn('hookq: the embedded database will be prepared at its first start instead')

// tap builds its plugins from package.json's "tap.plugin" only when it notices a change, and the
// run that notices still uses the stale set (with ts-node, which fails on TypeScript 7). Building
// here makes the first `npm test` on a fresh clone work. Skipped where tap is not installed
// (production installs without dev dependencies).
const tapBin = fileURLToPath(new URL('../node_modules/.bin/tap', import.meta.url))
if (!existsSync(tapBin)) process.exit(0)
const build = spawnSync(tapBin, ['build'], { stdio: 'inherit' })
process.exit(build.status ?? 1)

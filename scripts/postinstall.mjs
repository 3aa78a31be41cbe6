// After npm install / npm ci: generate the Prisma client, and rebuild tap's plugin set.
// tap builds its plugins from package.json's "tap.plugin" only when it notices a change, and the
// run that notices still uses the stale set (with ts-node, which fails on TypeScript 7). Building
// here makes the first `npm test` on a fresh clone work. Skipped where tap is not installed
// (production installs without dev dependencies).
import { existsSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const generate = spawnSync(process.execPath, [fileURLToPath(new URL('./prisma-generate.mjs', import.meta.url))], { stdio: 'inherit' })
if (generate.status !== 0) process.exit(generate.status ?? 1)

const tapBin = fileURLToPath(new URL('../node_modules/.bin/tap', import.meta.url))
if (!existsSync(tapBin)) process.exit(0)
const build = spawnSync(tapBin, ['build'], { stdio: 'inherit' })
process.exit(build.status ?? 1)

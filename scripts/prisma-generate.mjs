// Runs `prisma generate` for the Rust-free `prisma-client` generator.
// The Prisma CLI insists on locating a native schema engine before `generate`, even though this
// generator never runs it, and that binary cannot be downloaded on machines without internet.
// Pointing PRISMA_SCHEMA_ENGINE_BINARY at any executable (node itself) satisfies the check.
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
let cli
try {
  cli = require.resolve('prisma/build/index.js')
} catch {
  console.error('prisma-generate: the prisma package is not installed; run npm install')
  process.exit(1)
}
const env = { ...process.env }
env.PRISMA_SCHEMA_ENGINE_BINARY ??= process.execPath
env.PRISMA_HIDE_UPDATE_MESSAGE = '1'
const r = spawnSync(process.execPath, [cli, 'generate'], { stdio: 'inherit', env })
process.exit(r.status ?? 1)

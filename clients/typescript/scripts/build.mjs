#!/usr/bin/env node
/**
 * Builds the publishable @hookq/client: plain ES modules with declarations, runnable by Node 20
 * without TypeScript, in dist/package/ (or `--out <dir>`), ready for `npm pack <dir>`.
 *
 *   node scripts/build.mjs [--out <dir>]        (npm run build -w @hookq/client)
 *
 * The repository keeps importing src/*.ts through tsx; this writes a separate package beside it:
 * tsc with tsconfig.build.json, a package.json derived from the workspace one (exports pointing
 * at the .js and .d.ts files, no scripts or devDependencies, not private), a README, and the
 * sources under src/ so the declaration maps lead an editor to them.
 */
import { spawnSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const workspace = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const { values } = parseArgs({ options: { out: { type: 'string' } } })
const out = path.resolve(values.out ?? path.join(workspace, 'dist', 'package'))
// Emptied first, so only a directory that is missing, empty or an earlier build of this package,
// and never one holding the workspace (`--out /`, `--out ..`).
const fromOut = path.relative(out, workspace)
if (fromOut === '' || (!fromOut.startsWith('..') && !path.isAbsolute(fromOut)))
  throw new Error(`refusing to build into ${out}: it holds the workspace`)
if (existsSync(out) && readdirSync(out).length > 0) {
  let previous
  try {
    previous = JSON.parse(readFileSync(path.join(out, 'package.json'), 'utf8')).name
  } catch {}
  if (previous !== '@hookq/client') throw new Error(`refusing to empty ${out}: it is not empty and holds no earlier build of @hookq/client`)
}

const pkg = JSON.parse(readFileSync(path.join(workspace, 'package.json'), 'utf8'))

rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })

// The workspace's own TypeScript (the root may pin another major), run by this Node.
const tsc = createRequire(path.join(workspace, 'package.json')).resolve('typescript/bin/tsc')
const compiled = spawnSync(process.execPath, [tsc, '-p', path.join(workspace, 'tsconfig.build.json'), '--outDir', out], {
  stdio: 'inherit',
})
if (compiled.status !== 0) {
  console.error(`tsc failed (${compiled.status ?? compiled.signal})`)
  process.exit(1)
}

// tsc rewrites `./x.ts` to `./x.js` in the .js files but not in the declarations
// (microsoft/TypeScript#61037); same length, so the declaration maps stay exact.
const RELATIVE_TS = /(\bfrom\s+|\bimport\s*\(\s*)(['"])(\.\.?\/[^'"]+)\.ts\2/g
for (const name of readdirSync(out)) {
  if (name.endsWith('.d.ts')) {
    const file = path.join(out, name)
    const text = readFileSync(file, 'utf8')
    const rewritten = text.replace(RELATIVE_TS, '$1$2$3.js$2')
    if (/(['"])\.\.?\/[^'"]+\.ts\1/.test(rewritten)) throw new Error(`${name} still imports a .ts file`)
    writeFileSync(file, rewritten)
  } else if (name.endsWith('.d.ts.map')) {
    // Point the maps at the copies under src/ shipped with the package, not at this checkout.
    const file = path.join(out, name)
    const map = JSON.parse(readFileSync(file, 'utf8'))
    map.sources = map.sources.map((source) => `src/${path.basename(source)}`)
    map.sourceRoot = ''
    writeFileSync(file, JSON.stringify(map))
  }
}
mkdirSync(path.join(out, 'src'))
for (const name of readdirSync(path.join(workspace, 'src'))) {
  if (name.endsWith('.ts')) copyFileSync(path.join(workspace, 'src', name), path.join(out, 'src', name))
}

// Each workspace export `./src/x.ts` becomes the built `./x.js` with its `./x.d.ts`.
const exports = {}
for (const [subpath, source] of Object.entries(pkg.exports)) {
  const m = /^\.\/src\/([\w-]+)\.ts$/.exec(source)
  if (m === null) throw new Error(`export ${subpath} is ${source}: expected ./src/<name>.ts`)
  exports[subpath] = { types: `./${m[1]}.d.ts`, default: `./${m[1]}.js` }
}
exports['./package.json'] = './package.json'

const published = {
  name: pkg.name,
  version: pkg.version,
  description: pkg.description,
  license: pkg.license,
  type: 'module',
  exports,
  main: exports['.'].default,
  types: exports['.'].types,
  engines: { node: '>=20' },
  files: ['*.js', '*.d.ts', '*.d.ts.map', 'src/'],
  dependencies: pkg.dependencies,
}
writeFileSync(path.join(out, 'package.json'), `${JSON.stringify(published, null, 2)}\n`)
writeFileSync(path.join(out, 'README.md'), readme(published))
// The project's licence (README and LICENSE are always packed; `files` need not list them).
copyFileSync(path.join(workspace, '..', '..', 'LICENSE'), path.join(out, 'LICENSE'))
console.log(`built ${pkg.name}@${pkg.version} in ${path.relative(process.cwd(), out) || '.'}`)

function readme({ name, description }) {
  return `# ${name}

${description}.

Plain ES modules with TypeScript declarations: it runs on Node.js 20 or later as it is, with no
TypeScript tooling. TypeScript users get every route typed (paths, parameters, bodies, answers and
problem documents); the consumer's types refer to \`node:http\`, so they need \`@types/node\`.

## Install

\`\`\`sh
npm install ${name}
\`\`\`

## The client

\`\`\`js
import { createClient, unwrap, HookqError } from '${name}'

// baseUrl defaults to HOOKQ_URL, then http://127.0.0.1:8080; apiKey to HOOKQ_API_KEY (sent as a bearer token)
const hookq = createClient({ baseUrl: 'http://127.0.0.1:8080', apiKey: process.env.HOOKQ_API_KEY })

await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'orders' } }, body: { partitions: 4 } }))
const { results } = await unwrap(hookq.POST('/v1/topics/{topic}/messages', {
  params: { path: { topic: 'orders' } },
  body: { messages: [{ key: 'user-7', value: { order: 46 } }] },
}))
console.log(results)                       // [ { partition: 0, offset: … } ]

try {
  await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'nope' } } }))
} catch (err) {
  if (err instanceof HookqError) console.log(err.status, err.code)   // 404 topic_not_found
}
\`\`\`

Without \`unwrap\`, each call resolves with \`{ data, error, response }\`
([openapi-fetch](https://openapi-ts.dev/openapi-fetch/)).

## A push consumer: \`${name}/consumer\`

\`\`\`js
import http from 'node:http'
import { createConsumer } from '${name}/consumer'

const consumer = createConsumer({
  secret: process.env.HOOKQ_WEBHOOK_SECRET,   // the consumer's whsec_... secret
  // acks and nacks go to HOOKQ_URL with HOOKQ_API_KEY (or pass baseUrl and apiKey, or client)
  nackDelayMs: 5_000,                         // a failed message comes back after 5 s
  idempotency: true,                          // a redelivered webhook-id is acked, not handled again
  async handler (message) {
    console.log(message.topic, message.offset, message.value)   // throw to have it pushed again
  },
})
http.createServer(consumer.listener).listen(3000)
\`\`\`

The handler's return acks the message and a throw nacks it. For Fastify,
\`app.register(consumer.fastify, { path: '/hookq' })\`; anywhere else,
\`await consumer.handle({ headers, body })\` with the raw body. \`verifyWebhook\`, \`signWebhook\` and
\`parsePush\` from the same entry check a signature and read a push by hand.

For exactly-once effects in your own PostgreSQL database, pass
\`idempotency: new PgIdempotencyStore({ pool })\` with a node-postgres \`Pool\` and write through
\`ctx.tx\` in the handler (\`async handler (message, { tx }) { await tx.query(...) }\`): each
message's id is recorded in the same transaction as your writes, and the ack follows the COMMIT.
This package does not depend on \`pg\`; bring your own.
`
}

/**
 * @hookq/client as published: built by clients/typescript/scripts/build.mjs, packed with `npm pack`,
 * unpacked into a scratch app's node_modules, then run by plain `node` (Node 20 cannot load
 * TypeScript at all, and no loader is passed) against a real broker: topic, produce, read back, a
 * real signed push handled by the packed consumer and acked through the packed client, and
 * signWebhook/verifyWebhook. Its declarations typecheck a consumer's NodeNext project with the
 * workspace's TypeScript, and a wrong body type fails it.
 */
import t from '../helpers/tap.ts'
import { execFile } from 'node:child_process'
import { createRequire } from 'node:module'
import fs from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { startListeningBroker } from '../helpers/broker.ts'

const root = fileURLToPath(new URL('../..', import.meta.url))
const workspace = path.join(root, 'clients', 'typescript')
// The workspace's own TypeScript, wherever npm put it (nested today: the root pins another major).
const tsc = createRequire(path.join(workspace, 'package.json')).resolve('typescript/bin/tsc')

interface Run {
  code: number | string | null
  stdout: string
  stderr: string
}

// The settings of the npx that started tap (npm_config_local_prefix and the like) stay out of npm.
const plainEnv: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)))
plainEnv.npm_config_update_notifier = 'false'

/**
 * Runs a command to its end; never rejects, so a failure's output reaches the assertion. Through
 * `env -u`: tap's process tracker puts its loader in every child's NODE_OPTIONS, and its coverage
 * directory in NODE_V8_COVERAGE; these children get neither.
 */
function exec(file: string, args: string[], options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      'env',
      ['-u', 'NODE_OPTIONS', '-u', 'NODE_V8_COVERAGE', file, ...args],
      { cwd: options.cwd, env: options.env ?? plainEnv, timeout: options.timeoutMs ?? 60_000, maxBuffer: 16 << 20 },
      (err, stdout, stderr) =>
        resolve({ code: err ? ((err as { code?: number | string }).code ?? err.signal ?? null) : 0, stdout, stderr }),
    )
  })
}

/** Throws with the command's output unless it exited 0: the package must exist for any test to run. */
function succeeded(what: string, run: Run): Run {
  if (run.code !== 0) throw new Error(`${what} exited ${run.code}:\n${run.stdout}${run.stderr}`)
  return run
}

const tmp = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'hookq-sdk-pack-')))
t.teardown(() => fs.rm(tmp, { recursive: true, force: true }))
const out = path.join(tmp, 'package')
const app = path.join(tmp, 'app')
const installed = path.join(app, 'node_modules', '@hookq', 'client')

// Built into the scratch directory, so a build of dist/ running meanwhile does not interfere.
succeeded('build', await exec(process.execPath, [path.join(workspace, 'scripts', 'build.mjs'), '--out', out], { cwd: root }))
const packed = succeeded('npm pack', await exec('npm', ['pack', out, '--pack-destination', tmp, '--json'], { cwd: tmp }))
const [tarball] = JSON.parse(packed.stdout) as Array<{ filename: string; files: Array<{ path: string }> }>
await fs.mkdir(installed, { recursive: true })
succeeded('tar', await exec('tar', ['-xzf', path.join(tmp, tarball!.filename), '-C', installed, '--strip-components=1'], { cwd: tmp }))
// The package's one dependency, and Node's types for the typecheck, from this checkout: no network.
await fs.symlink(path.join(root, 'node_modules', 'openapi-fetch'), path.join(app, 'node_modules', 'openapi-fetch'), 'dir')
await fs.mkdir(path.join(app, 'node_modules', '@types'))
await fs.symlink(path.join(root, 'node_modules', '@types', 'node'), path.join(app, 'node_modules', '@types', 'node'), 'dir')
await fs.writeFile(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }))

/** The plain-node app: every value it prints comes from the broker or the packed package. */
const APP = `
import http from 'node:http'
import { randomBytes } from 'node:crypto'
import { createClient, unwrap, HookqError } from '@hookq/client'
import { createConsumer, signWebhook, verifyWebhook, WebhookVerificationError } from '@hookq/client/consumer'

const hookq = createClient({ baseUrl: process.env.HOOKQ_URL })
const secret = 'whsec_' + randomBytes(32).toString('base64')

const pushes = []
const consumer = createConsumer({
  secret,
  baseUrl: process.env.HOOKQ_URL,
  onError: (error, info) => console.error('consumer', info.stage, error),
  handler (m) { pushes.push({ offset: m.offset, key: m.key, value: m.value, attempt: m.attempt }) },
})
const server = http.createServer(consumer.listener)
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))

const topic = await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'packed' } }, body: { partitions: 1 } }))
await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'packed' } }, body: { topic: 'packed' } }))
await unwrap(hookq.POST('/v1/groups/{group}/consumers', {
  params: { path: { group: 'packed' } }, body: { url: 'http://127.0.0.1:' + server.address().port + '/', secret },
}))
const produced = await unwrap(hookq.POST('/v1/topics/{topic}/messages', {
  params: { path: { topic: 'packed' } }, body: { messages: [{ key: 'k1', value: { n: 1 } }, { value: 'two' }] },
}))
const read = await unwrap(hookq.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
  params: { path: { topic: 'packed', partition: 0 }, query: { fromOffset: 0 } },
}))
const missing = await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'missing' } } }))
  .then(() => null, (e) => ({ isHookqError: e instanceof HookqError, status: e.status, code: e.code }))

// Both pushed and acked: the group's lag drops to 0 (20 s at most).
let status
for (const deadline = Date.now() + 20_000; Date.now() < deadline;) {
  status = await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'packed' } } }))
  if (pushes.length >= 2 && status.partitions.every((p) => p.lag === 0 && p.inFlight === 0)) break
  await new Promise((resolve) => setTimeout(resolve, 100))
}
server.close()
server.closeAllConnections()

const body = JSON.stringify({ hello: 'packed' })
const timestampSeconds = Math.floor(Date.now() / 1000)
const headers = {
  'webhook-id': 'msg_packed',
  'webhook-timestamp': String(timestampSeconds),
  'webhook-signature': signWebhook({ webhookId: 'msg_packed', timestampSeconds, body, secrets: secret }),
}
const verified = verifyWebhook({ secret, headers, body })
let tampered = null
try {
  verifyWebhook({ secret, headers, body: body + ' ' })
} catch (e) {
  tampered = { isVerificationError: e instanceof WebhookVerificationError, reason: e.reason }
}

console.log(JSON.stringify({
  execArgv: process.execArgv,
  nodeOptions: process.env.NODE_OPTIONS ?? null,
  resolved: { client: import.meta.resolve('@hookq/client'), consumer: import.meta.resolve('@hookq/client/consumer') },
  topic,
  produced: produced.results,
  read: read.messages.map((m) => ({ offset: m.offset, key: m.key, value: m.value })),
  missing,
  pushes: pushes.sort((a, b) => a.offset - b.offset),
  committed: status.partitions.map((p) => p.committedOffset),
  timestampSeconds,
  verified,
  tampered,
}))
`

/** A typed consumer of the package, as an application would write it. */
const GOOD = `import http from 'node:http'
import { createClient, unwrap, HookqError, type ProduceMessage, type Topic } from '@hookq/client'
import { createConsumer, PgIdempotencyStore, verifyWebhook, WebhookVerificationError, type PgClientLike, type PushMessage } from '@hookq/client/consumer'

const hookq = createClient({ baseUrl: 'http://127.0.0.1:8080', apiKey: process.env.HOOKQ_API_KEY })

export async function produce (): Promise<number> {
  const topic: Topic = await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'orders' } }, body: { partitions: 2 } }))
  const messages: ProduceMessage[] = [{ key: 'a', value: { n: 1 }, headers: { source: 'app' } }]
  const { results } = await unwrap(hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: topic.name } }, body: { messages } }))
  const { data, error } = await hookq.GET('/v1/groups/{group}', { params: { path: { group: 'billing' } } })
  if (error) {
    const code: string = error.code
    throw new HookqError(404, { code }, null)
  }
  const lags: number[] = data.partitions.map((p) => p.lag)
  return results[0]!.offset + lags.length
}

interface Order { n: number }
const consumer = createConsumer<Order>({
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  nackDelayMs: (_error: unknown, message: PushMessage<Order>) => message.attempt * 1000,
  idempotency: true,
  async handler (message, ctx) {
    const n: number = message.value.n
    const when: Date = message.timestamp
    if (n < 0) await ctx.extend(5_000)
    void when
  },
})
http.createServer(consumer.listener)

// A transactional store on a pool of the app's own (no pg installed): ctx.tx is its client type.
interface AppClient extends PgClientLike { appName: string }
declare const pool: { connect (): Promise<AppClient> }
const exactlyOnce = createConsumer({
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  idempotency: new PgIdempotencyStore({ pool, table: 'app.handled' }),
  async handler (message, { tx }) {
    const name: string = tx.appName
    const { rowCount } = await tx.query('INSERT INTO seen (id) VALUES ($1)', [message.webhookId])
    void name
    void rowCount
  },
})
void exactlyOnce

export function check (headers: Record<string, string>, body: string): string {
  try {
    return verifyWebhook({ secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', headers, body }).webhookId
  } catch (err) {
    if (err instanceof WebhookVerificationError) return err.reason
    throw err
  }
}
`

/** The same client, with a string where the topic's partition count must be a number (line 5). */
const BAD = `import { createClient, unwrap } from '@hookq/client'

const hookq = createClient({ baseUrl: 'http://127.0.0.1:8080' })
export const topic = await unwrap(hookq.PUT('/v1/topics/{topic}', {
  params: { path: { topic: 'orders' } }, body: { partitions: 'two' },
}))
`

t.test('the tarball holds the built package, with a package.json fit to publish', async (t) => {
  const files = tarball!.files.map((f) => f.path)
  for (const f of [
    'package.json',
    'README.md',
    'LICENSE',
    'index.js',
    'index.d.ts',
    'index.d.ts.map',
    'consumer.js',
    'consumer.d.ts',
    'schema.d.ts',
    'src/index.ts',
    'pg-idempotency.js',
    'pg-idempotency.d.ts',
  ]) {
    t.ok(files.includes(f), `packs ${f}`)
  }
  t.notOk(
    files.some((f) => f.startsWith('scripts/') || f.includes('tsconfig')),
    'no build files',
  )
  const pkg = JSON.parse(await fs.readFile(path.join(installed, 'package.json'), 'utf8'))
  const source = JSON.parse(await fs.readFile(path.join(workspace, 'package.json'), 'utf8'))
  t.match(pkg, {
    name: source.name,
    version: source.version,
    license: source.license,
    type: 'module',
    dependencies: source.dependencies,
    engines: { node: '>=20' },
  })
  t.same(pkg.exports['.'], { types: './index.d.ts', default: './index.js' })
  t.same(pkg.exports['./consumer'], { types: './consumer.d.ts', default: './consumer.js' })
  t.equal(pkg.private, undefined, 'not private')
  t.equal(pkg.scripts, undefined, 'no scripts')
  t.equal(pkg.devDependencies, undefined, 'no devDependencies')
  const declarations = await fs.readFile(path.join(installed, 'consumer.d.ts'), 'utf8')
  t.match(declarations, "from './client.js'", 'declarations import the .js names')
  t.notMatch(declarations, /from '\.\/[^']+\.ts'/)
  const pgStore = await fs.readFile(path.join(installed, 'pg-idempotency.js'), 'utf8')
  t.notMatch(pgStore, /from ['"]pg['"]|import\(['"]pg['"]\)/, "the PostgreSQL store loads no pg (the app's pool is passed in)")
  const map = JSON.parse(await fs.readFile(path.join(installed, 'index.d.ts.map'), 'utf8'))
  t.same(map.sources, ['src/index.ts'], 'the declaration map points at the shipped source')
})

t.test('plain node runs the packed client and consumer against a real broker', async (t) => {
  const { url } = await startListeningBroker(t)
  await fs.writeFile(path.join(app, 'app.mjs'), APP)
  const child = await exec(process.execPath, ['app.mjs'], { cwd: app, env: { ...plainEnv, HOOKQ_URL: url }, timeoutMs: 60_000 })
  t.equal(child.code, 0, child.code === 0 ? 'exits 0' : `exit code; ${child.stdout}${child.stderr}`)
  const r = JSON.parse(child.stdout)

  t.same(r.execArgv, [], 'no loader flags')
  t.equal(r.nodeOptions, null, 'no preloaded modules')
  t.equal(r.resolved.client, `file://${installed}/index.js`, 'the unpacked package, not the workspace')
  t.equal(r.resolved.consumer, `file://${installed}/consumer.js`)

  t.equal(r.topic.partitions, 1)
  t.same(r.produced, [
    { partition: 0, offset: 0 },
    { partition: 0, offset: 1 },
  ])
  t.same(r.read, [
    { offset: 0, key: 'k1', value: { n: 1 } },
    { offset: 1, key: null, value: 'two' },
  ])
  t.same(r.missing, { isHookqError: true, status: 404, code: 'topic_not_found' })
  t.same(
    r.pushes.map((p: { offset: number; key: string | null; value: unknown; attempt: number }) => [p.offset, p.key, p.value, p.attempt]),
    [
      [0, 'k1', { n: 1 }, 1],
      [1, null, 'two', 1],
    ],
    'each message pushed once, verified and handled',
  )
  t.same(r.committed, [2], 'acked: the group committed past both')

  t.same(r.verified, { webhookId: 'msg_packed', timestampSeconds: r.timestampSeconds })
  t.same(r.tampered, { isVerificationError: true, reason: 'bad_signature' })
})

t.test('the packed declarations typecheck a consumer project, and catch a wrong call', async (t) => {
  await fs.writeFile(path.join(app, 'good.ts'), GOOD)
  await fs.writeFile(path.join(app, 'bad.ts'), BAD)
  // A NodeNext, strict consumer without DOM types; lib checking on, so the shipped .d.ts are checked too.
  const flags = [
    '--noEmit',
    '--strict',
    '--module',
    'nodenext',
    '--moduleResolution',
    'nodenext',
    '--target',
    'es2022',
    '--lib',
    'es2022',
    '--types',
    'node',
  ]

  const good = await exec(process.execPath, [tsc, ...flags, '--listFiles', 'good.ts'], { cwd: app })
  t.equal(good.code, 0, good.code === 0 ? 'tsc good.ts passes' : `tsc good.ts: ${good.stdout}${good.stderr}`)
  const listed = good.stdout.split('\n')
  t.ok(
    listed.includes(`${installed}/index.d.ts`) && listed.includes(`${installed}/consumer.d.ts`),
    'checked against the packed declarations',
  )

  const bad = await exec(process.execPath, [tsc, ...flags, '--skipLibCheck', 'bad.ts'], { cwd: app })
  t.equal(bad.code, 2, 'tsc bad.ts fails')
  const errors = bad.stdout.split('\n').filter((l) => /error TS\d+/.test(l))
  t.equal(errors.length, 1, `one error: ${bad.stdout}`)
  t.match(
    errors[0],
    /^bad\.ts\(5,\d+\): error TS2322: Type 'string' is not assignable to type 'number'/,
    'the wrong body field, nothing else',
  )
})

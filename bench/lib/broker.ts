/** The broker under test as a child process, started as `npm start` starts it (node with the start script's flags), on a port we pick. */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { createServer } from 'node:net'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { ROOT, exited, stopChild, track } from './child.ts'

export interface BrokerProcess {
  child: ChildProcess
  pid: number
  url: string
  /** The last few KB of its stdout and stderr, for failure messages. */
  output(): string
}

/** A port that was free a moment ago (bound to port 0 and closed again). */
async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve, reject) => server.listen(0, '127.0.0.1', resolve).once('error', reject))
  const { port } = server.address() as { port: number }
  await new Promise((resolve) => server.close(resolve))
  return port
}

/**
 * The arguments `npm start` gives node (package.json's start script without its leading `node`), so
 * the bench runs the broker with the same flags as users do.
 */
function startArgs(root: string): string[] {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: { start: string } }
  const [node, ...args] = pkg.scripts.start.trim().split(/\s+/)
  if (node !== 'node') throw new Error(`package.json's start script does not begin with node: ${pkg.scripts.start}`)
  // Flags NODE_OPTIONS refuses (--cpu-prof) go before the script: BENCH_BROKER_ARGS.
  const extra = (process.env.BENCH_BROKER_ARGS ?? '').split(/\s+/).filter(Boolean)
  return [...extra, ...args]
}

/**
 * Starts the broker on `databaseUrl` and resolves once GET /healthz answers 200. The bench
 * environment is passed through, so HOOKQ_* settings (HOOKQ_COMMIT_CONCURRENCY…) reach it.
 * `env` adds to (or overrides) the environment the broker gets, HOOKQ_PROCESSES for one.
 * `root` runs the broker of another checkout, as its own package.json starts it (default BENCH_ROOT, else
 * this one): bench/ab.ts, or a before/after of any scenario in one sitting.
 * Node flags for the broker alone go through NODE_OPTIONS (`--perf-basic-prof` for `perf record`), or
 * BENCH_BROKER_ARGS for those NODE_OPTIONS refuses (`--cpu-prof --cpu-prof-dir=/tmp/prof`).
 */
export async function startBroker(
  databaseUrl: string,
  opts: { timeoutMs: number; env?: Record<string, string>; root?: string },
): Promise<BrokerProcess> {
  const root = opts.root ?? (process.env.BENCH_ROOT || ROOT)
  const port = await freePort()
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    ...opts.env,
    DATABASE_URL: databaseUrl,
    HOST: '127.0.0.1',
    PORT: String(port),
    LOG_LEVEL: 'warn',
  }
  delete env.HOOKQ_API_KEYS // the load sends no Authorization header
  const nodeArgs = startArgs(root)
  const child = track(spawn(process.execPath, nodeArgs, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] }))
  let out = ''
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-8000)
  }
  child.stdout!.on('data', keep)
  child.stderr!.on('data', keep)
  const broker: BrokerProcess = { child, pid: child.pid!, url: `http://127.0.0.1:${port}`, output: () => out }

  const deadline = Date.now() + opts.timeoutMs
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`the broker exited (${child.exitCode ?? child.signalCode}) before answering /healthz:\n${out}`)
    }
    try {
      const res = await fetch(`${broker.url}/healthz`, { signal: AbortSignal.timeout(1000) })
      if (res.status === 200) return broker
    } catch {
      /* not listening yet */
    }
    await sleep(200)
  }
  await stopChild(child, 5000, 'SIGKILL')
  throw new Error(`the broker did not answer /healthz within ${opts.timeoutMs} ms:\n${out}`)
}

/** SIGTERM (the broker finishes work in progress and exits; --cpu-prof writes its file then). */
export async function stopBroker(broker: BrokerProcess, graceMs = 30_000): Promise<void> {
  await stopChild(broker.child, graceMs)
  await exited(broker.child)
}

/** One JSON call to the broker at `base`; throws on an answer of 300 or more, with its body. */
export async function brokerApi<T = unknown>(base: string, method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(`${base}${path}`, {
    method,
    ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(30_000),
  })
  const text = await res.text()
  if (res.status >= 300) throw new Error(`${method} ${path}: HTTP ${res.status} ${text.slice(0, 500)}`)
  return (text ? JSON.parse(text) : undefined) as T
}

/** A group's committed offsets summed over its partitions: the messages it has completed. */
export async function committedOffsets(base: string, group: string): Promise<number> {
  const s = await brokerApi<{ partitions: { committedOffset: number }[] }>(base, 'GET', `/v1/groups/${group}`)
  return s.partitions.reduce((n, p) => n + p.committedOffset, 0)
}

/**
 * An HTTP server on 127.0.0.1 that hands each request's body to `onBody` and answers what it returns
 * (200 and no body by default): the receivers of the smaller benches, the OAuth token endpoint.
 */
export async function serve(onBody: (body: string, path: string) => string | undefined): Promise<{ url: string; close(): void }> {
  const server = createHttpServer((req, res) => {
    let body = ''
    req.setEncoding('utf8')
    req.on('data', (d: string) => {
      body += d
    })
    req.on('end', () => {
      const answer = onBody(body, req.url ?? '/')
      res.writeHead(200, answer === undefined ? {} : { 'content-type': 'application/json' }).end(answer)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, close: () => server.close() }
}

/**
 * The real broker as a child process, for tests about processes, started as `npm start` starts it:
 * node with package.json's start flags (and TEST_ONLY_ARGS) running scripts/start.mjs, which runs the bundle of src/
 * (scripts/server-bundle.mjs says why) with source maps, so stacks name the source files.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { serverBundle } from '../../scripts/server-bundle.mjs'

const root = fileURLToPath(new URL('../../', import.meta.url))

/** node's arguments in `npm start` (package.json's start script without its leading `node`). */
const START_ARGS = (() => {
  const { scripts } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { scripts: { start: string } }
  const [node, ...args] = scripts.start.trim().split(/\s+/)
  if (node !== 'node') throw new Error(`package.json's start script does not begin with node: ${scripts.start}`)
  return args
})()

/**
 * V8's flag for a broker a test starts, before `npm start`'s: WebAssembly (Prisma's query compiler)
 * on the baseline compiler only. Tiering it up to TurboFan is for a broker that runs for days; a
 * test's runs for seconds, and paid more CPU for the tier-up than it won back (test/process/restart:
 * 18 -> 11.5 s of CPU for its four brokers and the test). The test processes run so too
 * (package.json's tap node-arg).
 */
const TEST_ONLY_ARGS = ['--liftoff-only']

/** The arguments of a broker process: the bundle is built here first, once, not by each process at once. */
async function brokerArgs(): Promise<string[]> {
  await serverBundle()
  return [...EXIT_WITH_PARENT, ...TEST_ONLY_ARGS, ...START_ARGS]
}

/** node's flags for a process a test starts: it ends itself once the test's process is gone (exit-with-parent.mjs). */
export const EXIT_WITH_PARENT = ['--import', new URL('./exit-with-parent.mjs', import.meta.url).href]

export interface BrokerProcess {
  child: ChildProcess
  url: string
  /** Resolves with the exit code (or signal name) when the process ends. */
  exited: Promise<number | string>
  output(): string
}

/**
 * How long a test lets a broker process take to start (or to fail to start) before it fails. The
 * start is watched (it listens, or the process exits): this only bounds a start that hangs. A
 * loaded machine (four test files at once beside other work) took a broker 30 s and more to start,
 * past the 60 s it once had, so: well beyond that, inside tap's limit of a file (180 s).
 */
export const START_LIMIT_MS = 150_000

/** Starts the broker with `env` on a free port; resolves once it listens (or fails if it exits first). */
export async function spawnBroker(env: Record<string, string>, timeoutMs = START_LIMIT_MS): Promise<BrokerProcess> {
  const b = await launchBroker(env)
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      b.child.kill('SIGKILL')
      reject(new Error(`broker did not start in ${timeoutMs} ms:\n${b.output()}`))
    }, timeoutMs)
    const check = () => {
      const m = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(b.output())
      if (m) {
        clearTimeout(timer)
        resolve(m[1]!)
      }
    }
    b.child.stdout!.on('data', check)
    void b.exited.then((code) => {
      clearTimeout(timer)
      reject(new Error(`broker exited (${code}) before listening:\n${b.output()}`))
    })
  })
  return { ...b, url }
}

/** Starts brokers on `env`, one a call, each SIGKILLed at the test's teardown if still running. */
export function brokerSpawner(
  t: { teardown(fn: () => unknown): void },
  env: Record<string, string>,
  timeoutMs = START_LIMIT_MS,
): (extra?: Record<string, string>) => Promise<BrokerProcess> {
  const procs: BrokerProcess[] = []
  t.teardown(() => {
    for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL')
  })
  // `extra`: this process's own settings on top of `env` (its cluster poll interval, say).
  return async (extra = {}) => {
    const p = await spawnBroker({ ...env, ...extra }, timeoutMs)
    procs.push(p)
    return p
  }
}

/** Starts the broker with `env` on a free port without waiting for it to listen (for tests of start-up). */
export async function launchBroker(env: Record<string, string>): Promise<Omit<BrokerProcess, 'url'>> {
  const child = spawn(process.execPath, await brokerArgs(), {
    cwd: root,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let out = ''
  child.stdout!.on('data', (d) => {
    out += d
  })
  child.stderr!.on('data', (d) => {
    out += d
  })
  const exited = new Promise<number | string>((resolve) => child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)))
  return { child, exited, output: () => out }
}

/** Runs the broker to completion (for start-up failures); resolves with its exit code and output. */
export async function runBrokerToExit(
  env: Record<string, string>,
  timeoutMs = START_LIMIT_MS,
): Promise<{ code: number | string; output: string }> {
  const child = spawn(process.execPath, await brokerArgs(), {
    cwd: root,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout.on('data', (d) => {
    output += d
  })
  child.stderr.on('data', (d) => {
    output += d
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  const code = await new Promise<number | string>((resolve) => child.on('exit', (c, s) => resolve(c ?? s ?? -1)))
  clearTimeout(timer)
  return { code, output }
}

export interface CallAnswer {
  status: number
  /** The parsed JSON body; the text when it is not JSON; undefined when empty. */
  json: any
  headers: Headers
  retryAfter: string | null
}

/** One HTTP call to a broker process (JSON in and out), with a timeout so a hung process fails the test. */
export async function callBroker(
  base: string,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
  timeoutMs = 30_000,
): Promise<CallAnswer> {
  const res = await fetch(base + path, {
    method,
    headers: { ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    body: body !== undefined ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(timeoutMs),
  })
  const text = await res.text()
  let json: any
  try {
    json = text ? JSON.parse(text) : undefined
  } catch {
    json = text
  }
  return { status: res.status, json, headers: res.headers, retryAfter: res.headers.get('retry-after') }
}

/**
 * SIGKILLs a broker launched as the supervisor of several processes: its children first, then it.
 * A child may exit between the listing and its kill (ESRCH): that is what the kill was for, and a
 * throw there would leave the supervisor running until tap's timeout (CI25).
 */
export function killTree(pid: number): void {
  for (const child of childrenOf(pid)) {
    try {
      process.kill(child, 'SIGKILL')
    } catch {} // gone meanwhile
  }
  try {
    process.kill(pid, 'SIGKILL')
  } catch {}
}

/** The pids of `pid`'s live child processes, read from /proc (field 4 of stat is the parent's pid). */
export const childrenOf = (pid: number): number[] => {
  const children: number[] = []
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    let stat: string
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8')
    } catch {
      continue
    } // gone meanwhile
    // After the command's closing parenthesis: state, ppid, ...; a zombie (Z) has exited already.
    const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    if (Number(ppid) === pid && state !== 'Z') children.push(Number(name))
  }
  return children
}

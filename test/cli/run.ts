/**
 * The hookq CLI as a child process (`node src/cli/hookq.mjs ...`), the way a user runs it: with a
 * clean environment (only PATH, HOME and what the test gives), stdin from the test, and its exit
 * code, stdout and stderr collected.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { EXIT_WITH_PARENT } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))

export interface CliRun {
  code: number | string
  stdout: string
  stderr: string
}

export interface CliOptions {
  /** HOOKQ_URL of the child (omitted: none, so the CLI's default). */
  url?: string
  env?: Record<string, string>
  /** Written to stdin, then closed; without it stdin is empty (/dev/null). */
  stdin?: string
  timeoutMs?: number
}

function start(args: string[], opts: CliOptions): ChildProcess {
  return spawn(process.execPath, [...EXIT_WITH_PARENT, 'src/cli/hookq.mjs', ...args], {
    cwd: root,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...(opts.url ? { HOOKQ_URL: opts.url } : {}), ...opts.env },
    stdio: [opts.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  })
}

/**
 * Runs the CLI to its end; kills it (SIGKILL) after `timeoutMs`, which then shows as the code. The
 * default (120 s) only stops a hung CLI with a readable failure: on a loaded machine a CLI that
 * starts, calls and prints took more than 30 s (the former default, which failed correct runs).
 */
export async function runCli(args: string[], opts: CliOptions = {}): Promise<CliRun> {
  const child = start(args, opts)
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d) => {
    stdout += d
  })
  child.stderr!.on('data', (d) => {
    stderr += d
  })
  if (opts.stdin !== undefined) child.stdin!.end(opts.stdin)
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000)
  const code = await new Promise<number | string>((resolve) => child.on('close', (c, s) => resolve(c ?? s ?? -1)))
  clearTimeout(timer)
  return { code, stdout, stderr }
}

/**
 * How long `stop` lets the CLI take to end before it SIGKILLs it (which then shows as the code): only
 * a stop that hangs. A graceful stop (`serve` draining, `tail --follow` ending) on a loaded machine
 * can take far longer than alone, and 10 s would turn a correct exit 0 into SIGKILL.
 */
const STOP_LIMIT_MS = 60_000

/** A CLI left running (tail --follow): its output so far, and a way to stop it by its pid. */
export interface RunningCli {
  child: ChildProcess
  stdout(): string
  stderr(): string
  /** Resolves when stdout contains `text`; rejects after `timeoutMs`. */
  waitForOutput(text: string, timeoutMs?: number): Promise<void>
  /** Sends `signal` to this child and resolves with its exit code (SIGKILL after STOP_LIMIT_MS). */
  stop(signal?: NodeJS.Signals): Promise<number | string>
}

/** Starts the CLI and leaves it running; the test must call `stop` (teardown does too). */
export function startCli(t: { teardown(fn: () => unknown): void }, args: string[], opts: CliOptions = {}): RunningCli {
  const child = start(args, opts)
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d) => {
    stdout += d
  })
  child.stderr!.on('data', (d) => {
    stderr += d
  })
  const exited = new Promise<number | string>((resolve) => child.on('close', (c, s) => resolve(c ?? s ?? -1)))
  const stop = async (signal: NodeJS.Signals = 'SIGINT') => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal)
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_LIMIT_MS)
    const code = await exited
    clearTimeout(timer)
    return code
  }
  t.teardown(() => stop('SIGKILL'))
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    waitForOutput: async (text, timeoutMs = 60_000) => {
      await waitUntil(() => stdout.includes(text), timeoutMs, `${JSON.stringify(text)} on the CLI's stdout (stderr: ${stderr})`)
    },
    stop,
  }
}

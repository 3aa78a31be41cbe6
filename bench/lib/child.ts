/** Child processes of the bench: tracked by pid so that cleanup ends exactly the ones it started. */
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'

export const ROOT = fileURLToPath(new URL('../../', import.meta.url))

/** Every child started and not yet exited; cleanup on failure or Ctrl-C kills these, by pid. */
export const children = new Set<ChildProcess>()

export function track(child: ChildProcess): ChildProcess {
  children.add(child)
  child.on('exit', () => children.delete(child))
  return child
}

/** Resolves once the child has exited (at once if it already has). */
export function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise((resolve) => child.once('exit', () => resolve()))
}

/** Sends `signal`, then SIGKILL if the child is still there after `graceMs`. */
export async function stopChild(child: ChildProcess, graceMs: number, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  child.kill(signal)
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs)
  await exited(child)
  clearTimeout(timer)
}

/**
 * Runs `node --import tsx <script> <JSON args>` from the project root and returns the JSON of its
 * last stdout line. Killed if it outlives `timeoutMs`; its stderr goes to ours.
 */
export async function runJsonWorker<T>(script: string, args: unknown, timeoutMs: number): Promise<T> {
  const child = track(
    spawn(process.execPath, ['--import', 'tsx', script, JSON.stringify(args)], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  )
  let out = ''
  child.stdout!.on('data', (d: Buffer) => {
    out += d
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  await exited(child)
  clearTimeout(timer)
  if (child.exitCode !== 0) throw new Error(`${script} failed (exit ${child.exitCode ?? child.signalCode})`)
  const last = out.trim().split('\n').pop() ?? ''
  return JSON.parse(last) as T
}

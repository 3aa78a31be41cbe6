/** Child processes of the bench: tracked by pid so that cleanup ends exactly the ones it started. */
import type { ChildProcess } from 'node:child_process'
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

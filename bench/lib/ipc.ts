/**
 * Long-lived bench workers driven over Node's IPC channel: the parent sends commands and awaits
 * their answers, the worker can also send events (e.g. "every message arrived"). Used by e2e.ts for
 * the webhook receiver and the load process, which live across scenarios.
 *
 * Parent → worker: { id, cmd, args }. Worker → parent: { id, ok: true, result } | { id, ok: false,
 * error } | { event, data }. A worker exits when the parent goes away (IPC disconnect), so an
 * orchestrator killed with SIGKILL leaves no receiver behind.
 */
import { spawn } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { ROOT, exited, stopChild, track } from './child.ts'

interface Answer {
  id: number
  ok: boolean
  result?: unknown
  error?: string
}
interface Event {
  event: string
  data: unknown
}

export interface IpcWorker {
  pid: number
  /** What the worker sent with its `ready` event. */
  ready: Record<string, unknown>
  /** Sends a command; rejects on the worker's error, its exit or `timeoutMs`. */
  call<T>(cmd: string, args: unknown, timeoutMs: number): Promise<T>
  /** Resolves with the data of the next `event` the worker emits (or rejects after `timeoutMs`). */
  next<T>(event: string, timeoutMs: number): Promise<T>
  /** SIGTERM, SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>
}

/** Starts `node --import tsx <script> <JSON args>` with an IPC channel; resolves on its `ready` event. */
export async function startIpcWorker(script: string, args: unknown, readyTimeoutMs: number): Promise<IpcWorker> {
  const child = track(
    spawn(process.execPath, ['--import', 'tsx', script, JSON.stringify(args)], {
      cwd: ROOT,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    }),
  )
  const events = new EventEmitter()
  const waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void; timer: NodeJS.Timeout }>()
  let seq = 0
  let gone: Error | undefined
  child.on('message', (m: Answer | Event) => {
    if ('event' in m) {
      events.emit(m.event, m.data)
      return
    }
    const w = waiting.get(m.id)
    if (!w) return
    waiting.delete(m.id)
    clearTimeout(w.timer)
    if (m.ok) w.resolve(m.result)
    else w.reject(new Error(`${script}: ${m.error}`))
  })
  child.on('exit', (code, signal) => {
    gone = new Error(`${script} exited (${code ?? signal})`)
    for (const w of waiting.values()) {
      clearTimeout(w.timer)
      w.reject(gone)
    }
    waiting.clear()
    if (events.listenerCount('error') > 0) events.emit('error', gone)
  })

  const next = async <T>(event: string, timeoutMs: number): Promise<T> => {
    if (gone) throw gone
    // once() rejects on an 'error' event: the exit handler emits one while someone waits.
    const [data] = await once(events, event, { signal: AbortSignal.timeout(timeoutMs) }).catch((err: unknown) => {
      throw err === gone ? gone : new Error(`${script}: no ${event} within ${timeoutMs} ms`)
    })
    return data as T
  }

  const ready = await next<Record<string, unknown>>('ready', readyTimeoutMs).catch(async (err: unknown) => {
    await stopChild(child, 2000, 'SIGKILL')
    throw err
  })
  return {
    pid: child.pid!,
    ready,
    next,
    call<T>(cmd: string, callArgs: unknown, timeoutMs: number): Promise<T> {
      if (gone) return Promise.reject(gone)
      const id = ++seq
      return new Promise<T>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(id)
          reject(new Error(`${script}: ${cmd} took over ${timeoutMs} ms`))
        }, timeoutMs)
        waiting.set(id, { resolve: resolve as (v: unknown) => void, reject, timer })
        child.send({ id, cmd, args: callArgs })
      })
    },
    async stop(graceMs = 3000) {
      await stopChild(child, graceMs)
      await exited(child)
    },
  }
}

// ---- the worker side

type Handler = (args: never) => unknown

/** In a worker: answers the parent's commands with `handlers` and announces `ready`. */
export function serveIpc(handlers: Record<string, Handler>, ready: Record<string, unknown>): void {
  if (!process.send) throw new Error('serveIpc: not started with an IPC channel')
  process.on('message', (m: { id: number; cmd: string; args: unknown }) => {
    const handler = handlers[m.cmd]
    const answer = (a: Answer) => {
      if (process.connected) process.send!(a)
    }
    if (!handler) {
      answer({ id: m.id, ok: false, error: `unknown command ${m.cmd}` })
      return
    }
    Promise.resolve()
      .then(() => (handler as (a: unknown) => unknown)(m.args))
      .then(
        (result) => answer({ id: m.id, ok: true, result }),
        (err: unknown) => answer({ id: m.id, ok: false, error: err instanceof Error ? (err.stack ?? err.message) : String(err) }),
      )
  })
  // The parent went away (finished, or killed): nothing left to serve.
  process.on('disconnect', () => process.exit(0))
  emitEvent('ready', ready)
}

/** In a worker: sends an event to the parent. */
export function emitEvent(event: string, data: unknown): void {
  if (process.connected) process.send!({ event, data })
}

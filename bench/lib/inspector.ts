/**
 * A CPU profile of the broker over one window, taken through its inspector (the broker started
 * with `inspect: true`, bench/lib/broker.ts): unlike --cpu-prof, which covers the whole process
 * from start-up, this covers exactly one scenario. Speaks just enough of the Chrome DevTools
 * protocol (Profiler.enable/start/stop) over undici's WebSocket client.
 */
import { writeFileSync } from 'node:fs'
import { WebSocket } from 'undici'

export interface WindowProfiler {
  /** Stops profiling and writes the .cpuprofile to `file`. */
  stop(file: string): Promise<void>
}

/** Connects to `wsUrl` and starts the sampling profiler (`intervalUs` between samples). */
export async function startProfile(wsUrl: string, intervalUs = 1000, timeoutMs = 10_000): Promise<WindowProfiler> {
  const ws = new WebSocket(wsUrl)
  const waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>()
  let seq = 0
  ws.addEventListener('message', (ev) => {
    const m = JSON.parse(String(ev.data)) as { id?: number; result?: unknown; error?: { message: string } }
    if (m.id === undefined) return
    const w = waiting.get(m.id)
    if (!w) return
    waiting.delete(m.id)
    if (m.error) w.reject(new Error(`inspector: ${m.error.message}`))
    else w.resolve(m.result)
  })
  ws.addEventListener('close', () => {
    for (const w of waiting.values()) w.reject(new Error('inspector: connection closed'))
    waiting.clear()
  })
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`inspector: no connection to ${wsUrl} within ${timeoutMs} ms`)), timeoutMs)
    ws.addEventListener('open', () => {
      clearTimeout(timer)
      resolve()
    })
    ws.addEventListener('error', () => {
      clearTimeout(timer)
      reject(new Error(`inspector: cannot connect to ${wsUrl}`))
    })
  })
  const send = <T>(method: string, params: object = {}, callTimeoutMs = timeoutMs): Promise<T> =>
    new Promise<T>((resolve, reject) => {
      const id = ++seq
      const timer = setTimeout(() => {
        waiting.delete(id)
        reject(new Error(`inspector: ${method} took over ${callTimeoutMs} ms`))
      }, callTimeoutMs)
      waiting.set(id, {
        resolve: (v) => {
          clearTimeout(timer)
          resolve(v as T)
        },
        reject: (e) => {
          clearTimeout(timer)
          reject(e)
        },
      })
      ws.send(JSON.stringify({ id, method, params }))
    })
  try {
    await send('Profiler.enable')
    await send('Profiler.setSamplingInterval', { interval: intervalUs })
    await send('Profiler.start')
  } catch (err) {
    ws.close()
    throw err
  }
  return {
    async stop(file: string) {
      try {
        const { profile } = await send<{ profile: unknown }>('Profiler.stop', {}, 60_000)
        writeFileSync(file, JSON.stringify(profile))
        await send('Profiler.disable').catch(() => undefined)
      } finally {
        // Closed, so the broker does not wait for a debugger at exit.
        ws.close()
      }
    },
  }
}

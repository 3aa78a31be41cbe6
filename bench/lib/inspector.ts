/**
 * A CPU profile or an allocation profile of the broker over one window, taken through its
 * inspector (the broker started with `inspect: true`, bench/lib/broker.ts): unlike --cpu-prof,
 * which covers the whole process from start-up, this covers exactly one scenario. Speaks just
 * enough of the Chrome DevTools protocol (Profiler.*, HeapProfiler.*) over undici's WebSocket client.
 */
import { writeFileSync } from 'node:fs'
import { WebSocket } from 'undici'

export interface WindowProfiler {
  /** Stops profiling and writes the .cpuprofile to `file`. */
  stop(file: string): Promise<void>
}

type Send = <T>(method: string, params?: object, callTimeoutMs?: number) => Promise<T>

/** Connects to `wsUrl`: a call of one protocol method at a time, and close. */
async function connect(wsUrl: string, timeoutMs: number): Promise<{ send: Send; close(): void }> {
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
  const send: Send = <T>(method: string, params: object = {}, callTimeoutMs = timeoutMs) =>
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
  return { send, close: () => ws.close() }
}

/** Runs `begin`, and gives a profiler whose stop runs `end` and writes what it returns to a file. */
async function window(
  wsUrl: string,
  timeoutMs: number,
  begin: (send: Send) => Promise<void>,
  end: (send: Send) => Promise<unknown>,
): Promise<WindowProfiler> {
  const { send, close } = await connect(wsUrl, timeoutMs)
  try {
    await begin(send)
  } catch (err) {
    close()
    throw err
  }
  return {
    async stop(file: string) {
      try {
        writeFileSync(file, JSON.stringify(await end(send)))
      } finally {
        // Closed, so the broker does not wait for a debugger at exit.
        close()
      }
    },
  }
}

/** Connects to `wsUrl` and starts the sampling profiler (`intervalUs` between samples): a .cpuprofile. */
export function startProfile(wsUrl: string, intervalUs = 1000, timeoutMs = 10_000): Promise<WindowProfiler> {
  return window(
    wsUrl,
    timeoutMs,
    async (send) => {
      await send('Profiler.enable')
      await send('Profiler.setSamplingInterval', { interval: intervalUs })
      await send('Profiler.start')
    },
    async (send) => {
      const { profile } = await send<{ profile: unknown }>('Profiler.stop', {}, 60_000)
      await send('Profiler.disable').catch(() => undefined)
      return profile
    },
  )
}

/**
 * Connects to `wsUrl` and starts sampling allocations (one sample per `intervalBytes` allocated on
 * average): a .heapprofile. Objects the collector has freed meanwhile are kept in it, so it says
 * where allocation happens (what the young generation's collections pay for), not what is live.
 */
export function startHeapSampling(wsUrl: string, intervalBytes = 8192, timeoutMs = 10_000): Promise<WindowProfiler> {
  return window(
    wsUrl,
    timeoutMs,
    async (send) => {
      await send('HeapProfiler.enable')
      await send('HeapProfiler.startSampling', {
        samplingInterval: intervalBytes,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true,
      })
    },
    async (send) => {
      const { profile } = await send<{ profile: unknown }>('HeapProfiler.stopSampling', {}, 60_000)
      await send('HeapProfiler.disable').catch(() => undefined)
      return profile
    },
  )
}

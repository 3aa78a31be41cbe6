/**
 * A real webhook receiver for tests: a node:http server on 127.0.0.1, port 0, that records every
 * request and answers the way the test says, a way the test may change at any moment
 * (`setBehaviour`), like svix's test receiver. Closed at teardown, hung and endless answers included.
 */
import http from 'node:http'
import type net from 'node:net'
import { waitUntil } from './wait.ts'

/** One request as the receiver saw it. */
export interface Received {
  method: string
  path: string
  headers: http.IncomingHttpHeaders
  body: string
  /** The body parsed as JSON, or undefined when it is not JSON. */
  json: unknown
  /** The client's port: the same value for two requests means one reused socket. */
  remotePort: number
  /** When the whole request had arrived (Date.now()). */
  receivedAt: number
  /** Body bytes the receiver wrote back, updated while it writes. */
  sentBytes: number
  /** Whether the response is over: finished, or its socket closed under it. */
  closed: boolean
}

/** How to answer. Fields combine where it makes sense (`delayMs` then `status`, `headers`, `body`). */
export interface BehaviourSpec {
  /** Status to answer (default 200). */
  status?: number
  headers?: Record<string, string>
  /** Response body (default `ok`). */
  body?: string
  /** Wait this long before answering, ms. */
  delayMs?: number
  /**
   * Answer only once this has settled (then wait `delayMs`, if set): to answer after a call the
   * handler made (an ack, a nack) has been answered, however long that takes.
   */
  after?: PromiseLike<unknown>
  /** Never answer; the socket stays open until the client or `close()` ends it. */
  hang?: boolean
  /** Destroy the socket with a TCP RST instead of answering. */
  reset?: boolean
  /** Send the headers, then one body byte every `dripMs`, never ending. */
  dripMs?: number
  /** Send the headers, then body chunks as fast as the client reads, never ending. */
  endlessBody?: boolean
  /** Answer 302 with this `location`. */
  redirectTo?: string
}

/**
 * The requests sorted by the offset they carry (the envelope's `offset`, or a raw push's
 * `hookq-offset` header). An unordered partition's pushes run in parallel, each on a connection
 * of its own, so they may arrive in any order: a test that means "offset 0's push" says so.
 */
export function inOffsetOrder(requests: Received[]): Received[] {
  const offset = (r: Received) => (r.json as { offset?: number } | undefined)?.offset ?? Number(r.headers['hookq-offset'])
  return [...requests].sort((a, b) => offset(a) - offset(b))
}

/** A fixed answer, or one chosen per request. */
export type Behaviour = BehaviourSpec | ((req: Received) => BehaviourSpec)

export interface Receiver {
  /** The base URL, e.g. `http://127.0.0.1:41234`; any path is accepted. */
  url: string
  requests: Received[]
  setBehaviour(b: Behaviour): void
  /** Resolves with the requests once at least `n` have arrived; rejects after `timeoutMs` (default 30 s: a failure bound, see wait.ts). */
  waitFor(n: number, timeoutMs?: number): Promise<Received[]>
  close(): Promise<void>
}

// An endless body stops after this much anyway, so a client bug cannot make a test run forever.
const ENDLESS_LIMIT_BYTES = 1 << 30
const CHUNK = Buffer.alloc(16 * 1024, 'x')

/** Starts a receiver answering 200 `ok`; it closes itself at `t.teardown`. */
export async function startReceiver(t: { teardown(fn: () => unknown): void }, initial: Behaviour = { status: 200 }): Promise<Receiver> {
  let behaviour = initial
  const requests: Received[] = []
  const sockets = new Set<net.Socket>()
  const timers = new Set<NodeJS.Timeout>()
  const later = (fn: () => void, ms: number) => {
    const timer = setTimeout(() => {
      timers.delete(timer)
      fn()
    }, ms)
    timers.add(timer)
  }

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      let json: unknown
      try {
        json = JSON.parse(body)
      } catch {
        json = undefined
      }
      const received: Received = {
        method: req.method ?? '',
        path: req.url ?? '',
        headers: req.headers,
        body,
        json,
        remotePort: req.socket.remotePort ?? 0,
        receivedAt: Date.now(),
        sentBytes: 0,
        closed: false,
      }
      requests.push(received)
      res.on('close', () => {
        received.closed = true
      })
      const spec = typeof behaviour === 'function' ? behaviour(received) : behaviour
      const go = () => {
        if (spec.delayMs) later(() => answer(spec, req, res, received), spec.delayMs)
        else answer(spec, req, res, received)
      }
      if (spec.after) spec.after.then(go, go)
      else go()
    })
  })
  server.on('connection', (socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
  })

  function answer(spec: BehaviourSpec, req: http.IncomingMessage, res: http.ServerResponse, received: Received): void {
    if (res.destroyed) return
    if (spec.hang) return
    if (spec.reset) {
      req.socket.resetAndDestroy()
      return
    }
    if (spec.redirectTo) {
      res.writeHead(302, { location: spec.redirectTo }).end()
      return
    }
    res.writeHead(spec.status ?? 200, spec.headers)
    if (spec.dripMs) {
      res.flushHeaders() // the status goes out now; only the body drips
      const timer = setInterval(() => {
        res.write('.')
        received.sentBytes++
      }, spec.dripMs)
      res.on('close', () => clearInterval(timer))
      return
    }
    if (spec.endlessBody) {
      // Writes until the socket buffer is full, then waits for 'drain': only what the client reads is sent.
      const pump = () => {
        while (!res.destroyed && received.sentBytes < ENDLESS_LIMIT_BYTES) {
          received.sentBytes += CHUNK.length
          if (!res.write(CHUNK)) {
            res.once('drain', pump)
            return
          }
        }
        if (!res.destroyed) res.end()
      }
      pump()
      return
    }
    const body = spec.body ?? 'ok'
    received.sentBytes = Buffer.byteLength(body)
    res.end(body)
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject)
      resolve()
    })
  })
  const port = (server.address() as net.AddressInfo).port

  let closing: Promise<void> | undefined
  const close = () => {
    closing ??= new Promise<void>((resolve) => {
      for (const timer of timers) clearTimeout(timer)
      timers.clear()
      server.close(() => resolve())
      // Hung, dripping and endless answers keep their sockets open: end them so the process can exit.
      for (const socket of sockets) socket.destroy()
    })
    return closing
  }
  t.teardown(close)

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    setBehaviour: (b) => {
      behaviour = b
    },
    waitFor: (n, timeoutMs = 30_000) =>
      waitUntil(() => (requests.length >= n ? requests : undefined), timeoutMs, `${n} requests at the receiver`),
    close,
  }
}

/**
 * The HTTP/1.1 client pushes go out on: keep-alive connections pooled per origin, one request per
 * connection at a time (no pipelining: a slow consumer must not hold up the pushes queued behind
 * it on one socket), and answers read just as far as a push needs: status, `Retry-After`,
 * `Connection` and `Keep-Alive`, and the body up to a cap.
 *
 * Why not undici, which every other outgoing call of the broker uses (src/http/forward.ts): a push
 * is the broker's hottest path, and undici, general and careful, spent more of the main thread per
 * push than any other part of a message's way through the broker (its Request object and header
 * validation, a wasm llhttp parser, stream plumbing, and the garbage behind them: ~28 us a push).
 * This client writes each request as one string, parses the answer from the socket's own buffers
 * (plain TCP reads land in one shared buffer), and allocates a handful of objects per push. What it
 * leaves out is what a push never needs: redirects (never followed anyway), request streams,
 * trailers' contents, upgrades, HTTP/2, proxies. (figures: docs/performance.md#the-push-client)
 *
 * A connection's states:
 *
 *   connecting ──▶ busy (one request written, its answer being read) ──answer complete, reusable──▶ idle
 *        │            │  ▲                                                                       │
 *        │            │  └──────────────────────── next request queued or sent ◀─────────────────┘
 *        └────────────┴──▶ closed (error, deadline, an answer that ends the connection, idle timeout)
 *
 * Answers that end the connection: `Connection: close`, HTTP/1.0 without keep-alive, a body
 * delimited by the close, one cut at the cap while still arriving, bytes beyond the answer.
 */
import net, { type LookupFunction } from 'node:net'
import tls from 'node:tls'
import { timerDelayMs } from '../core/timer-delay.ts'

/** Where requests go: parsed once per consumer URL. */
export interface Origin {
  /** `protocol//host:port`, the pool's key. */
  key: string
  tls: boolean
  hostname: string
  port: number
  /** The Host header's value. */
  host: string
}

export interface HttpClientOptions {
  /** Connections per origin at most; more requests wait in the origin's queue (default 32). */
  connections?: number
  /** Idle time before a pooled connection is closed, ms (default 4000). */
  keepAliveTimeoutMs?: number
  /** Cap on a server's `Keep-Alive: timeout=` hint, ms (default 60 000). */
  keepAliveMaxTimeoutMs?: number
  /** TCP (and TLS) connect timeout, ms (default 10 000). */
  connectTimeoutMs?: number
  /** The resolver connections use (the push URL policy wraps it; see pusher.ts). */
  lookup?: LookupFunction
}

/** What came of a request. */
export type HttpOutcome =
  | { kind: 'answer'; status: number; retryAfter: string | undefined; body: string }
  | { kind: 'timeout' }
  | { kind: 'network'; error: unknown }
  /** `mayStart` said no when a connection was free for the request: nothing was written. */
  | { kind: 'unsent' }

/** One request: written whole (the client then drops body and headerLines), answered through `done` exactly once. */
export interface HttpRequest {
  /** Path and query, e.g. `/hooks?x=1`. */
  path: string
  /** Header lines, each `name: value\r\n`, without Host and Content-Length (the client adds those). */
  headerLines: string
  body: string | Buffer
  /** Deadline for the whole answer, queueing included, ms. */
  timeoutMs: number
  /** Body bytes kept; the rest is read and dropped, or past DISCARD_BYTES the connection closed. */
  maxBodyBytes: number
  /**
   * Asked each time a connection is given to the request, at once or after it queued behind the
   * origin's others (it may have waited long): false ends it `unsent`, with nothing written; true
   * and it is written (a connect that fails after that is a network error). Without it, it goes.
   */
  mayStart?: () => boolean
  done(outcome: HttpOutcome): void
}

/** Answer bytes read past the cap before the connection is given up instead of drained. */
const DISCARD_BYTES = 64 * 1024
/** An answer's head larger than this is refused (undici's default limit is 16 KiB). */
const MAX_HEAD_BYTES = 64 * 1024
const CRLF2 = Buffer.from('\r\n\r\n')
const CRLF = Buffer.from('\r\n')

class ClientClosedError extends Error {
  readonly code = 'ERR_CLIENT_CLOSED'
}

interface Pending {
  req: HttpRequest
  timer: NodeJS.Timeout
  conn: Connection | undefined
  settled: boolean
}

export class HttpClient {
  private readonly pools = new Map<string, OriginPool>()
  private closed = false
  readonly options: Required<Omit<HttpClientOptions, 'lookup'>> & { lookup: LookupFunction | undefined }

  constructor(opts: HttpClientOptions = {}) {
    this.options = {
      connections: Math.max(1, opts.connections ?? 32),
      keepAliveTimeoutMs: opts.keepAliveTimeoutMs ?? 4_000,
      keepAliveMaxTimeoutMs: opts.keepAliveMaxTimeoutMs ?? 60_000,
      connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
      lookup: opts.lookup,
    }
  }

  /** Sends `req` to `origin`; `req.done` is called exactly once, never synchronously. */
  request(origin: Origin, req: HttpRequest): void {
    if (this.closed) {
      queueMicrotask(() => req.done({ kind: 'network', error: new ClientClosedError('the push client is closed') }))
      return
    }
    let pool = this.pools.get(origin.key)
    if (!pool) this.pools.set(origin.key, (pool = new OriginPool(origin, this.options, () => this.pools.delete(origin.key))))
    const p: Pending = { req, timer: undefined as unknown as NodeJS.Timeout, conn: undefined, settled: false }
    // The request rides along as the timer's argument: no closure to allocate per request.
    p.timer = setTimeout(expire, timerDelayMs(req.timeoutMs), p)
    pool.dispatch(p)
  }

  /** Takes no more requests; waits for those under way (each is bounded by its deadline), then closes every connection. */
  async close(): Promise<void> {
    this.closed = true
    await Promise.all([...this.pools.values()].map((pool) => pool.close()))
  }

  /** Closes every connection now; requests under way end as network errors. */
  destroy(): void {
    this.closed = true
    for (const pool of [...this.pools.values()]) pool.destroy()
  }
}

/** A request's deadline passed: it ends as a timeout, and its connection (if it has one) with it. */
function expire(p: Pending): void {
  if (settle(p, { kind: 'timeout' })) p.conn?.destroy()
}

const UNSENT: HttpOutcome = { kind: 'unsent' }

/**
 * Ends a request its `mayStart` refused: told in a microtask, never from inside the pool's own
 * step (request() promises no synchronous answer, and an answer may send the request again).
 */
function refuse(p: Pending): void {
  if (p.settled) return
  p.settled = true
  clearTimeout(p.timer)
  queueMicrotask(() => p.req.done(UNSENT))
}

/** Ends a request once: false when it had ended already (its deadline came first, say). */
function settle(p: Pending, outcome: HttpOutcome): boolean {
  if (p.settled) return false
  p.settled = true
  clearTimeout(p.timer)
  p.req.done(outcome)
  return true
}

class OriginPool {
  readonly conns = new Set<Connection>()
  /** Idle connections, the most recently used last (reused first: the others may time out). */
  readonly idle: Connection[] = []
  private queue: Pending[] = []
  private head = 0
  private closing: (() => void) | undefined

  constructor(
    readonly origin: Origin,
    readonly options: HttpClient['options'],
    private readonly onEmpty: () => void,
  ) {}

  dispatch(p: Pending): void {
    if (this.idle.length === 0 && this.conns.size >= this.options.connections) {
      this.queue.push(p)
      return
    }
    if (p.req.mayStart && !p.req.mayStart()) return refuse(p)
    const conn = this.idle.pop()
    if (conn) return conn.send(p)
    const fresh = new Connection(this)
    this.conns.add(fresh)
    fresh.send(p)
  }

  /** A connection finished its request and may take another. */
  release(conn: Connection): void {
    const next = this.nextQueued()
    if (next) return conn.send(next)
    if (this.closing) return conn.destroy()
    this.idle.push(conn)
    conn.idle()
  }

  /** A connection closed: its slot may carry a queued request on a new one. */
  remove(conn: Connection): void {
    this.conns.delete(conn)
    const i = this.idle.indexOf(conn)
    if (i >= 0) this.idle.splice(i, 1)
    const next = this.closing ? undefined : this.nextQueued()
    if (next) {
      const fresh = new Connection(this)
      this.conns.add(fresh)
      fresh.send(next)
    } else if (this.conns.size === 0 && this.head === this.queue.length) {
      this.closing?.()
      this.onEmpty()
    }
  }

  close(): Promise<void> {
    if (this.conns.size === 0) return Promise.resolve()
    const done = new Promise<void>((resolve) => {
      this.closing = resolve
    })
    for (const c of this.idle.splice(0)) c.destroy()
    return done
  }

  destroy(): void {
    // Queued requests were never written: those that ask before they start are told so (unsent).
    const queued = this.queue.slice(this.head)
    this.queue = []
    this.head = 0
    for (const p of queued)
      settle(p, p.req.mayStart ? UNSENT : { kind: 'network', error: new ClientClosedError('the push client was closed') })
    for (const c of [...this.conns]) c.destroy(new ClientClosedError('the push client was closed'))
  }

  /** The oldest queued request still waiting and allowed to start (those whose deadline passed are skipped, those refused end unsent). */
  private nextQueued(): Pending | undefined {
    while (this.head < this.queue.length) {
      const p = this.queue[this.head]!
      this.queue[this.head++] = undefined as unknown as Pending
      if (this.head > 1024 && this.head * 2 > this.queue.length) {
        this.queue = this.queue.slice(this.head)
        this.head = 0
      }
      if (p.settled) continue
      if (p.req.mayStart && !p.req.mayStart()) {
        refuse(p)
        continue
      }
      return p
    }
    return undefined
  }
}

type BodyMode = 'none' | 'length' | 'chunked' | 'close'

class Connection {
  private readonly socket: net.Socket
  private pending: Pending | undefined
  private closed = false
  private idleTimer: NodeJS.Timeout | undefined
  private idleMs: number
  // The answer being read.
  private buf: Buffer | undefined
  private inHead = true
  private status = 0
  private retryAfter: string | undefined
  private reusable = true
  private mode: BodyMode = 'none'
  /** Body bytes still to come (length), or of the current chunk (chunked; -1: a size line is next). */
  private remaining = 0
  /** Chunked: after the last chunk, the trailer section is being skipped. */
  private trailers = false
  /** The answer is complete (its request settled once the data at hand is read). */
  private answered = false
  /** The body kept so far, decoded piece by piece (a piece may end inside a UTF-8 sequence: see finish). */
  private kept: Buffer[] = []
  /** kept[i] for i >= this are views of the socket's current chunk, to copy if the answer goes on past it. */
  private keptOwned = 0
  private keptBytes = 0
  private seenBytes = 0

  constructor(private readonly pool: OriginPool) {
    const { origin, options } = pool
    this.idleMs = options.keepAliveTimeoutMs
    const common = { host: origin.hostname, port: origin.port, ...(options.lookup ? { lookup: options.lookup } : {}) }
    // Plain TCP reads land in one buffer shared by every connection (see READ_BUFFER), handed
    // straight to onData; TLS sockets decrypt into chunks of their own and keep the 'data' event.
    this.socket = origin.tls
      ? tls.connect({ ...common, ...(net.isIP(origin.hostname) ? {} : { servername: origin.hostname }), ALPNProtocols: ['http/1.1'] })
      : net.connect({ ...common, onread: { buffer: READ_BUFFER, callback: (n: number) => this.onRead(n) } })
    this.socket.setNoDelay(true)
    this.socket.setTimeout(timerDelayMs(options.connectTimeoutMs))
    const connected = () => this.socket.setTimeout(0)
    this.socket.once(origin.tls ? 'secureConnect' : 'connect', connected)
    this.socket.on('timeout', () =>
      this.destroy(Object.assign(new Error(`connect timeout after ${options.connectTimeoutMs} ms`), { code: 'ETIMEDOUT' })),
    )
    if (origin.tls) this.socket.on('data', (chunk: Buffer) => this.onData(chunk))
    this.socket.on('end', () => this.onEnd())
    this.socket.on('error', (err) => this.destroy(err))
    this.socket.on('close', () => this.destroy())
  }

  /** Writes a request; its answer ends it. */
  send(p: Pending): void {
    if (this.idleTimer) {
      clearTimeout(this.idleTimer)
      this.idleTimer = undefined
    }
    this.pending = p
    p.conn = this
    this.reset()
    const { req } = p
    const length = typeof req.body === 'string' ? Buffer.byteLength(req.body) : req.body.length
    const head = `POST ${req.path} HTTP/1.1\r\nhost: ${this.pool.origin.host}\r\n${req.headerLines}content-length: ${length}\r\n\r\n`
    if (typeof req.body === 'string') {
      // One buffer, one write: the head is ASCII, the body UTF-8, each copied once.
      const headLength = head.length
      const bytes = Buffer.allocUnsafe(headLength + length)
      bytes.write(head, 0, headLength, 'latin1')
      bytes.write(req.body, headLength, length, 'utf8')
      this.socket.write(bytes)
    } else {
      this.socket.cork()
      this.socket.write(head)
      this.socket.write(req.body)
      this.socket.uncork()
    }
    // A request is written once (none is ever sent again), so its text is let go of now rather
    // than held until the answer: a push's body and headers are most of what it keeps alive, and
    // what outlives a young-generation collection is what the collector pays for.
    req.body = ''
    req.headerLines = ''
  }

  /** Waits in the pool for the next request, for as long as the server is likely to keep it. */
  idle(): void {
    this.idleTimer = setTimeout(() => this.destroy(), timerDelayMs(this.idleMs))
    this.idleTimer.unref()
  }

  destroy(err?: unknown): void {
    if (this.closed) return
    this.closed = true
    if (this.idleTimer) clearTimeout(this.idleTimer)
    this.socket.destroy()
    const p = this.pending
    this.pending = undefined
    if (p)
      settle(p, {
        kind: 'network',
        error: err ?? Object.assign(new Error('the connection closed before the answer ended'), { code: 'ECONNRESET' }),
      })
    this.pool.remove(this)
  }

  private reset(): void {
    this.buf = undefined
    this.inHead = true
    this.status = 0
    this.retryAfter = undefined
    this.reusable = true
    this.mode = 'none'
    this.remaining = 0
    this.trailers = false
    this.answered = false
    this.kept = []
    this.keptOwned = 0
    this.keptBytes = 0
    this.seenBytes = 0
  }

  private onEnd(): void {
    // A body delimited by the close ends here; anything else cut short is a network error.
    if (this.pending && !this.inHead && this.mode === 'close') {
      this.reusable = false
      this.answered = true
      return this.finish(false)
    }
    this.destroy()
  }

  /** A plain TCP read: `n` bytes at the start of READ_BUFFER, which the next read overwrites. */
  private onRead(n: number): boolean {
    this.onData(READ_BUFFER.subarray(0, n))
    return true
  }

  /**
   * Reads a piece of the answer. `chunk` may be READ_BUFFER itself: nothing may keep a view of it
   * past this call (a partial head or size line is copied into `buf`, kept body pieces copied out).
   */
  private onData(chunk: Buffer): void {
    if (!this.pending) {
      // Bytes nobody asked for (an idle connection's server talking): it cannot be trusted again.
      return this.destroy()
    }
    let buf = this.buf ? Buffer.concat([this.buf, chunk]) : chunk
    this.buf = undefined
    while (buf.length > 0 && !this.answered && !this.closed) {
      if (this.inHead) {
        const end = buf.indexOf(CRLF2)
        if (end < 0) {
          if (buf.length > MAX_HEAD_BYTES) return this.destroy(protocolError("the answer's head is too large"))
          this.buf = Buffer.from(buf)
          return
        }
        if (!this.parseHead(buf.toString('latin1', 0, end))) return
        buf = buf.subarray(end + 4)
        // No body to come (204, 304, Content-Length: 0): the answer is whole.
        if (!this.inHead && this.mode === 'none') this.answered = true
        continue
      }
      buf = this.readBody(buf)
    }
    // Bytes past the answer: a server answering twice; the connection cannot be trusted again.
    if (this.answered && !this.closed) return this.finish(buf.length > 0)
    // The answer goes on in a later chunk: what was kept of this one is copied out of it, so a
    // body dripping in byte by byte cannot pin a socket buffer per byte.
    for (let i = this.keptOwned; i < this.kept.length; i++) this.kept[i] = Buffer.from(this.kept[i]!)
    this.keptOwned = this.kept.length
  }

  /** Parses the status line and headers; false when the connection was given up. */
  private parseHead(head: string): boolean {
    const m = /^HTTP\/1\.([01]) (\d{3})/.exec(head)
    if (!m) {
      this.destroy(protocolError('not an HTTP/1.x answer'))
      return false
    }
    const status = Number(m[2])
    // 1xx answers (100 Continue, 103 Early Hints) precede the real one; 101 would switch protocols.
    if (status >= 100 && status < 200) {
      if (status === 101) {
        this.destroy(protocolError('the server switched protocols'))
        return false
      }
      return true
    }
    this.status = status
    let keepAlive = m[1] === '1'
    let length = -1
    let chunked = false
    let hintMs: number | undefined
    let at = head.indexOf('\r\n')
    while (at >= 0) {
      const start = at + 2
      const next = head.indexOf('\r\n', start)
      const end = next < 0 ? head.length : next
      at = next
      const colon = head.indexOf(':', start)
      if (colon <= start || colon >= end) continue
      // Only a few names matter: compare by length first, and cut out only those that may match
      // (a header line costs no string of its own otherwise).
      const nameLength = colon - start
      if (nameLength !== 14 && nameLength !== 17 && nameLength !== 10 && nameLength !== 11) continue
      const name = head.slice(start, colon).toLowerCase()
      const value = head.slice(colon + 1, end).trim()
      if (name === 'content-length') {
        if (!/^\d+$/.test(value)) {
          this.destroy(protocolError('a bad Content-Length'))
          return false
        }
        const n = Number(value)
        if (length >= 0 && n !== length) {
          this.destroy(protocolError('conflicting Content-Length'))
          return false
        }
        length = n
      } else if (name === 'transfer-encoding') {
        chunked = /(?:^|,)\s*chunked\s*$/i.test(value)
        if (!chunked) {
          this.destroy(protocolError(`an unsupported Transfer-Encoding: ${value}`))
          return false
        }
      } else if (name === 'connection') {
        const v = value.toLowerCase()
        if (/(?:^|,)\s*close\s*(?:,|$)/.test(v)) keepAlive = false
        else if (/(?:^|,)\s*keep-alive\s*(?:,|$)/.test(v)) keepAlive = true
      } else if (name === 'keep-alive') {
        const t = /timeout\s*=\s*(\d+)/i.exec(value)
        if (t) hintMs = Number(t[1]) * 1000
      } else if (name === 'retry-after') {
        this.retryAfter = value
      }
    }
    this.reusable = keepAlive
    // A server's hint, less a second for the time the next request takes to get there.
    if (hintMs !== undefined) this.idleMs = Math.max(0, Math.min(this.pool.options.keepAliveMaxTimeoutMs, hintMs - 1000))
    this.inHead = false
    if (status === 204 || status === 304) this.mode = 'none'
    else if (chunked) {
      this.mode = 'chunked'
      this.remaining = -1
    } else if (length >= 0) {
      this.mode = length === 0 ? 'none' : 'length'
      this.remaining = length
    } else {
      this.mode = 'close'
      this.reusable = false
    }
    return true
  }

  /** Consumes body bytes from `buf`; returns what is left after the answer (or empty). */
  private readBody(buf: Buffer): Buffer {
    switch (this.mode) {
      case 'length': {
        const n = Math.min(this.remaining, buf.length)
        if (!this.keep(buf.subarray(0, n))) return EMPTY
        this.remaining -= n
        if (this.remaining === 0) this.answered = true
        return buf.subarray(n)
      }
      case 'close':
        this.keep(buf)
        return EMPTY
      case 'chunked':
        return this.readChunked(buf)
      default:
        return buf
    }
  }

  private readChunked(buf: Buffer): Buffer {
    while (buf.length > 0) {
      if (this.remaining > 0) {
        const n = Math.min(this.remaining, buf.length)
        if (!this.keep(buf.subarray(0, n))) return EMPTY
        this.remaining -= n
        buf = buf.subarray(n)
        if (this.remaining === 0) this.remaining = -2 // the CRLF after the chunk's data
        continue
      }
      const eol = buf.indexOf(CRLF)
      if (eol < 0) {
        if (buf.length > 4096) {
          this.destroy(protocolError('a chunk size line is too long'))
          return EMPTY
        }
        this.buf = Buffer.from(buf)
        return EMPTY
      }
      const line = buf.toString('latin1', 0, eol)
      buf = buf.subarray(eol + 2)
      if (this.remaining === -2) {
        this.remaining = -1
        continue
      }
      if (this.trailers) {
        if (line === '') {
          this.answered = true
          return buf
        }
        continue
      }
      const size = Number.parseInt(line, 16)
      if (!/^[0-9a-fA-F]+/.test(line) || !Number.isSafeInteger(size)) {
        this.destroy(protocolError('a bad chunk size'))
        return EMPTY
      }
      if (size === 0) {
        this.trailers = true
        continue
      }
      this.remaining = size
    }
    return EMPTY
  }

  /** Keeps body bytes up to the cap; false when the answer was cut (and completed) at DISCARD_BYTES. */
  private keep(part: Buffer): boolean {
    const maxBytes = this.pending!.req.maxBodyBytes
    const room = maxBytes - this.keptBytes
    if (room > 0 && part.length > 0) {
      const piece = part.length > room ? part.subarray(0, room) : part
      this.kept.push(piece)
      this.keptBytes += piece.length
    }
    this.seenBytes += part.length
    if (this.seenBytes > Math.max(DISCARD_BYTES, maxBytes)) {
      // An endless body: answered with what was kept, and the connection given up.
      this.reusable = false
      this.answered = true
      return false
    }
    return true
  }

  /** Settles the request with its answer; the connection goes back to the pool, or closes. */
  private finish(extraBytes: boolean): void {
    const p = this.pending
    if (!p) return
    this.pending = undefined
    p.conn = undefined
    const body =
      this.kept.length === 0 ? '' : this.kept.length === 1 ? this.kept[0]!.toString('utf8') : Buffer.concat(this.kept).toString('utf8')
    const reuse = this.reusable && !extraBytes && this.buf === undefined
    if (!reuse) this.destroy()
    settle(p, { kind: 'answer', status: this.status, retryAfter: this.retryAfter, body })
    if (reuse && !this.closed) this.pool.release(this)
  }
}

const EMPTY = Buffer.alloc(0)

/**
 * Where every plain TCP connection's reads land (net's `onread`). One buffer serves them all: a
 * read is handed to its connection's onData at once, on the one JavaScript thread, and consumed
 * or copied before the next read can start. It spares each answer what the socket's stream would
 * cost it: a fresh 64 KiB allocation shrunk to the bytes read, an ArrayBuffer over them, and the
 * Readable stream's push and 'data' event.
 */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024)

function protocolError(message: string): Error {
  return Object.assign(new Error(message), { code: 'HPE_INVALID' })
}

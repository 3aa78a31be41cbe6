/**
 * Answers sent before the request body was read (413 for a body over the limit, 401/403/429 from
 * the auth hook, 404 for an unknown route) must reach the client.
 *
 * Fastify answers a body-parser error with `connection: close`, and Node then destroys the socket
 * as soon as the answer is written. With the rest of the body still unread, the kernel answers the
 * close with a reset, and a client still sending (Node's fetch with an 11 MiB body, half the time)
 * gets EPIPE or ECONNRESET instead of the 413: it cannot tell "too large" from "broker down".
 *
 * So an answer that goes out while the body is incomplete keeps the connection open, and the rest
 * of the body is read and thrown away (HTTP framing stays intact, so the connection can serve the
 * next request), up to `maxBytes` and `maxMs`; past either the socket is destroyed, so a client
 * cannot make the broker read for ever.
 *
 * A request sent with `Connection: close` must end its connection after the answer whatever the
 * broker does, and Node does it with `destroySoon()`: a FIN, then at once a close of the socket
 * with the body still arriving, which is a reset (~30% of such requests lost their 413 or 401).
 * There the close lingers instead (RFC 9112, section 9.6): the FIN goes out after the answer, the
 * rest of the body is read and thrown away as above, and the socket is destroyed once the body has
 * ended (or the client closed, or a bound was passed).
 */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { timerDelayMs } from '../core/timer-delay.ts'

export interface UnreadBodyOptions {
  /** Bytes of an unread body read and discarded at most before the connection is cut. */
  maxBytes: number
  /** How long the rest of the body may take before the connection is cut. */
  maxMs: number
}

/** Called as an answer goes out (an onSend hook; not while shutting down, when the connection closes as before). */
export function drainUnreadBody(req: FastifyRequest, reply: FastifyReply, opts: UnreadBodyOptions): void {
  const raw = req.raw
  // inject() has no socket and always a complete body; `complete` is false only on a real
  // connection whose body has not been received to its end.
  if (raw.complete !== false) return
  const socket = raw.socket
  // Keep the connection when the client would (Fastify's `connection: close` after a body-parser
  // error goes); when it asked to close (or spoke HTTP/1.0), say so, and close without a reset.
  const keepAlive = reply.raw.shouldKeepAlive
  if (keepAlive) reply.removeHeader('connection')
  else reply.header('connection', 'close')

  // A decompressing preParsing stream (@fastify/compress) may be piped from the request: unhook
  // it, so what is thrown away is not inflated first.
  raw.unpipe()
  raw.removeAllListeners('data')
  let read = 0
  let lingering = false
  const cut = () => {
    clearTimeout(timer)
    raw.removeListener('data', count)
    socket.destroy()
  }
  const count = (chunk: Buffer) => {
    read += chunk.length
    if (read > opts.maxBytes) cut()
  }
  const timer = setTimeout(cut, timerDelayMs(opts.maxMs))
  timer.unref()
  raw.on('data', count)
  raw.once('end', () => {
    clearTimeout(timer)
    // The whole body is in: nothing unread is left to turn the close into a reset.
    if (lingering) socket.destroy()
  })
  raw.once('close', () => clearTimeout(timer))
  raw.resume()

  // Node closes after this answer with destroySoon(): half-close instead, until the body is in.
  if (!keepAlive) {
    const destroySoon = socket.destroySoon.bind(socket)
    socket.destroySoon = () => {
      if (raw.complete) return destroySoon() // the body ended meanwhile: nothing unread is left
      lingering = true
      if (socket.writable) socket.end()
    }
  }
}

/**
 * Server timeouts (HOOKQ_REQUEST_TIMEOUT_MS, HOOKQ_HEADERS_TIMEOUT_MS, HOOKQ_KEEP_ALIVE_TIMEOUT_MS):
 * a client dripping headers or a body, or sitting idle, loses its connection instead of holding it
 * for ever. Short timeouts here; the windows asserted are several times longer.
 */
import net from 'node:net'
import t, { type Test } from 'tap'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

const { broker, url } = await startListeningBroker(t, {
  HOOKQ_REQUEST_TIMEOUT_MS: '1000',
  HOOKQ_HEADERS_TIMEOUT_MS: '500',
  HOOKQ_KEEP_ALIVE_TIMEOUT_MS: '300',
})
const port = Number(new URL(url).port)
const WINDOW_MS = 8000
// The tests run side by side: each holds connections of its own, and its time is a server timeout
// passing, which they need not wait out in turn.
t.jobs = 5

interface Client {
  sock: net.Socket
  received: () => string
  closed: () => boolean
  drip: (text: string, everyMs: number) => void
}

/** A raw connection to `to`; drip() writes `text` a character at a time, until the socket closes. */
function connect(t: Test, to = port): Client {
  const sock = net.connect({ host: '127.0.0.1', port: to })
  let received = ''
  let closed = false
  let timer: NodeJS.Timeout | undefined
  sock.on('data', (d) => {
    received += d
  })
  sock.on('error', () => {})
  sock.on('close', () => {
    closed = true
    clearInterval(timer)
  })
  t.teardown(() => {
    clearInterval(timer)
    sock.destroy()
  })
  return {
    sock,
    received: () => received,
    closed: () => closed,
    drip(text, everyMs) {
      let i = 0
      timer = setInterval(() => {
        if (!closed && i < text.length) sock.write(text[i++]!)
      }, everyMs)
    },
  }
}

t.test('a connection dripping its headers is closed', async (t) => {
  const c = connect(t)
  c.drip(`GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ${'a'.repeat(500)}\r\n\r\n`, 100)
  await waitUntil(c.closed, WINDOW_MS, 'the dripping connection closed')
  t.notMatch(c.received(), /^HTTP\/1\.1 200/, 'no answer to the request it never finished')
})

t.test('a connection dripping its body gets 408 and is closed', async (t) => {
  const c = connect(t)
  c.sock.write('POST /v1/topics/slow/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n')
  c.drip(`{"messages":[{"value":"${'a'.repeat(200)}"}]}`, 200)
  await waitUntil(c.closed, WINDOW_MS, 'the dripping connection closed')
  t.match(c.received(), /^HTTP\/1\.1 408 /)
})

t.test('a connection that sends nothing is closed', async (t) => {
  const c = connect(t)
  await waitUntil(c.closed, WINDOW_MS, 'the silent connection closed')
})

t.test('an idle keep-alive connection is closed after its answer; a normal request still works', async (t) => {
  const c = connect(t)
  c.sock.write('GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n')
  await waitUntil(() => /^HTTP\/1\.1 200 [\s\S]*\r\n\r\n/.test(c.received()), WINDOW_MS, 'the answer')
  await waitUntil(c.closed, WINDOW_MS, 'the idle connection closed')
  t.equal((await fetch(`${url}/healthz`)).status, 200, 'fetch still works')
})

t.test("connections handed to the server (a HOOKQ_PROCESSES process's own loopback port) time out too", async (t) => {
  // What server.ts's ownLoopbackPort does: a second listener emitting its sockets into app.server.
  const own = net.createServer((socket) => broker.app.server.emit('connection', socket))
  await new Promise<void>((resolve) => own.listen({ host: '127.0.0.1', port: 0 }, resolve))
  t.teardown(() => new Promise((resolve) => own.close(resolve)))
  const ownPort = (own.address() as net.AddressInfo).port

  const answered = connect(t, ownPort)
  answered.sock.write('GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n')
  await waitUntil(() => /^HTTP\/1\.1 200 /.test(answered.received()), WINDOW_MS, 'an answer through the loopback port')
  await waitUntil(answered.closed, WINDOW_MS, 'the idle keep-alive connection closed')

  const dripping = connect(t, ownPort)
  dripping.drip(`GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ${'a'.repeat(500)}\r\n\r\n`, 100)
  await waitUntil(dripping.closed, WINDOW_MS, 'the dripping connection closed')
})

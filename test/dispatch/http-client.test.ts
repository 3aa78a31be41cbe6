/**
 * The push client's HTTP/1.1 (src/dispatch/http-client.ts) against a raw TCP server on 127.0.0.1
 * that writes exactly the bytes a test gives it, split where the test splits them: what real
 * servers do that node:http never would in the other tests (answers in pieces, chunked bodies with
 * extensions and trailers, 1xx first, HTTP/1.0, close-delimited bodies, a second answer nobody
 * asked for, a head that is not HTTP), and when a connection may be used again.
 */
import { readFileSync } from 'node:fs'
import net from 'node:net'
import tls from 'node:tls'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { HttpClient, type HttpOutcome, type Origin } from '../../src/dispatch/http-client.ts'
import { waitUntil } from '../helpers/wait.ts'

interface Conn {
  socket: net.Socket
  requests: string[]
}

/** A server that answers each request with the pieces `answer` returns, written `gapMs` apart. */
async function rawServer(t: Test, answer: (request: string, conn: Conn) => (string | Buffer)[] | 'hang' | 'close', gapMs = 5) {
  const conns: Conn[] = []
  const server = net.createServer((socket) => {
    const conn: Conn = { socket, requests: [] }
    conns.push(conn)
    let buf = ''
    socket.on('data', async (d) => {
      buf += d.toString('latin1')
      for (;;) {
        const end = buf.indexOf('\r\n\r\n')
        if (end < 0) return
        const length = Number(/content-length: (\d+)/i.exec(buf.slice(0, end))?.[1] ?? 0)
        if (buf.length < end + 4 + length) return
        const request = buf.slice(0, end + 4 + length)
        buf = buf.slice(end + 4 + length)
        conn.requests.push(request)
        const pieces = answer(request, conn)
        if (pieces === 'hang') return
        if (pieces === 'close') {
          socket.destroy()
          return
        }
        for (const [i, p] of pieces.entries()) {
          if (i > 0) await new Promise((r) => setTimeout(r, gapMs))
          if (!socket.destroyed) socket.write(p)
        }
      }
    })
    socket.on('error', () => {})
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    for (const c of conns) c.socket.destroy()
    server.close()
  })
  const port = (server.address() as net.AddressInfo).port
  const origin: Origin = { key: `http://127.0.0.1:${port}`, tls: false, hostname: '127.0.0.1', port, host: `127.0.0.1:${port}` }
  return { origin, conns }
}

function send(
  client: HttpClient,
  origin: Origin,
  body = '{"a":1}',
  opts: { timeoutMs?: number; maxBodyBytes?: number } = {},
): Promise<HttpOutcome> {
  return new Promise((done) =>
    client.request(origin, {
      path: '/hook?x=1',
      headerLines: 'content-type: application/json\r\nx-one: 1\r\n',
      body,
      timeoutMs: opts.timeoutMs ?? 5000,
      maxBodyBytes: opts.maxBodyBytes ?? 4096,
      done,
    }),
  )
}

const ok = (extra = '', body = 'ok') => `HTTP/1.1 200 OK\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`

t.test('the request as written: one POST with Host, the headers given, Content-Length and the body', async (t) => {
  const s = await rawServer(t, () => [ok()])
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.same(await send(client, s.origin, '{"é":"ü"}'), { kind: 'answer', status: 200, retryAfter: undefined, body: 'ok' })
  const r = s.conns[0]!.requests[0]!
  t.match(r, /^POST \/hook\?x=1 HTTP\/1\.1\r\n/)
  t.match(r, new RegExp(`\r\nhost: 127\\.0\\.0\\.1:${s.origin.port}\r\n`))
  t.match(r, /\r\ncontent-type: application\/json\r\nx-one: 1\r\n/)
  t.match(r, /\r\ncontent-length: 11\r\n\r\n/, 'the length in bytes (9 characters, 11 bytes)')
  t.equal(Buffer.from(r, 'latin1').subarray(-11).toString('utf8'), '{"é":"ü"}')
})

t.test('answers in pieces: a head split anywhere, a body after it, chunked with extensions and trailers', async (t) => {
  const chunked =
    'HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n' +
    '5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: 1\r\n\r\n'
  const answers = [
    [ok('', 'split body').slice(0, 7), ok('', 'split body').slice(7, 30), ok('', 'split body').slice(30)],
    chunked.split(''), // one byte at a time
    ['HTTP/1.1 100 Continue\r\n\r\n', 'HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n', ok('', 'after 1xx')],
    ['HTTP/1.1 204 No Content\r\n\r\n'],
  ]
  let n = 0
  const s = await rawServer(t, () => answers[n++]!, 1)
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.same(await send(client, s.origin), { kind: 'answer', status: 200, retryAfter: undefined, body: 'split body' })
  t.same(await send(client, s.origin), { kind: 'answer', status: 500, retryAfter: '3', body: 'hello world' })
  t.same(await send(client, s.origin), { kind: 'answer', status: 200, retryAfter: undefined, body: 'after 1xx' }, '1xx answers are skipped')
  t.same(await send(client, s.origin), { kind: 'answer', status: 204, retryAfter: undefined, body: '' })
  t.equal(s.conns.length, 1, 'all on one connection: each answer ended where it said')
})

t.test('a UTF-8 character split between two pieces of the body comes out whole', async (t) => {
  const body = Buffer.from('prix: 5 €', 'utf8')
  const head = `HTTP/1.1 200 OK\r\ncontent-length: ${body.length}\r\n\r\n`
  const s = await rawServer(t, () => [
    Buffer.concat([Buffer.from(head), body.subarray(0, body.length - 1)]),
    body.subarray(body.length - 1),
  ])
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.same(await send(client, s.origin), { kind: 'answer', status: 200, retryAfter: undefined, body: 'prix: 5 €' })
})

t.test('answers in pieces on several connections at once each come out whole (their reads share one buffer)', async (t) => {
  // Each answer is cut inside its head, inside a chunk size line and inside its body, so every
  // connection holds a partial piece while the others' reads land in the same buffer.
  const answerFor = (id: string) => {
    const body = `answer ${id} ${'·'.repeat(40)} end`
    const bytes = Buffer.byteLength(body)
    return [
      'HTTP/1.1 200 OK\r\nTransfer-Enc',
      `oding: chunked\r\nx-id: ${id}\r\n\r\n${bytes.toString(16).slice(0, 1)}`,
      `${bytes.toString(16).slice(1)}\r\n${body.slice(0, 12)}`,
      `${body.slice(12)}\r\n0\r\n\r\n`,
    ]
  }
  const s = await rawServer(t, (request) => answerFor(/"id":"(\w+)"/.exec(request)![1]!), 2)
  const client = new HttpClient({ connections: 8 })
  t.teardown(() => client.destroy())
  const ids = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']
  for (let round = 0; round < 3; round++) {
    const outcomes = await Promise.all(ids.map((id) => send(client, s.origin, JSON.stringify({ id }))))
    t.same(
      outcomes.map((o) => (o.kind === 'answer' ? o.body : o.kind)),
      ids.map((id) => `answer ${id} ${'·'.repeat(40)} end`),
      `round ${round}: every connection got its own answer`,
    )
  }
  t.equal(s.conns.length, ids.length, 'one connection per request under way, reused each round')
})
t.test('connections that end with their answer: Connection: close, HTTP/1.0, a close-delimited body, a second answer', async (t) => {
  const answers: (string[] | 'close')[] = [
    [ok('connection: close\r\n')],
    ['HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok'],
    ['HTTP/1.1 200 OK\r\n\r\nuntil the end'],
    [ok() + ok()],
    [ok()],
    [ok()],
  ]
  let n = 0
  const s = await rawServer(t, (_r, conn) => {
    const a = answers[n++]!
    if (a !== 'close' && a[0]!.startsWith('HTTP/1.1 200 OK\r\n\r\n')) setTimeout(() => conn.socket.end(), 30)
    return a
  })
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.match(await send(client, s.origin), { kind: 'answer', status: 200, body: 'ok' })
  t.match(await send(client, s.origin), { kind: 'answer', status: 200, body: 'ok' })
  t.match(
    await send(client, s.origin),
    { kind: 'answer', status: 200, body: 'until the end' },
    'a body without a length ends with the connection',
  )
  t.match(await send(client, s.origin), { kind: 'answer', status: 200, body: 'ok' })
  t.match(await send(client, s.origin), { kind: 'answer', status: 200, body: 'ok' })
  t.match(await send(client, s.origin), { kind: 'answer', status: 200, body: 'ok' })
  t.same(
    s.conns.map((c) => c.requests.length),
    [1, 1, 1, 1, 2],
    'a new connection after each answer that ends one; kept after a plain one',
  )
})

t.test('a pooled connection the server closed while idle is not used again', async (t) => {
  const s = await rawServer(t, (_r, conn) => {
    setTimeout(() => conn.socket.end(), 20)
    return [ok()]
  })
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.match(await send(client, s.origin), { kind: 'answer', status: 200 })
  await new Promise((r) => setTimeout(r, 100))
  t.match(await send(client, s.origin), { kind: 'answer', status: 200 }, 'no error: a new connection')
  t.equal(s.conns.length, 2)
})

t.test('the Keep-Alive hint shortens how long an idle connection is kept', async (t) => {
  const s = await rawServer(t, () => [ok('keep-alive: timeout=1\r\n')])
  const client = new HttpClient({ keepAliveTimeoutMs: 60_000 })
  t.teardown(() => client.destroy())
  t.match(await send(client, s.origin), { kind: 'answer', status: 200 })
  // timeout=1 s, less a second for the trip: closed at once by the client.
  await new Promise((r) => setTimeout(r, 100))
  t.ok(s.conns[0]!.socket.destroyed || s.conns[0]!.socket.readableEnded, 'the client closed the idle connection')
})

t.test('what is not an answer is a network error, and the connection is dropped', async (t) => {
  const bad = [
    ['SSH-2.0-OpenSSH_9.2\r\n\r\n'],
    ['HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n'],
    ['HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok'],
    ['HTTP/1.1 101 Switching Protocols\r\n\r\n'],
    ['HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n'],
    ['HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n'],
  ]
  let n = 0
  const s = await rawServer(t, () => bad[n++]!)
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  for (let i = 0; i < bad.length; i++) t.match(await send(client, s.origin), { kind: 'network' }, JSON.stringify(bad[i]![0]!.slice(0, 40)))
  t.equal(s.conns.length, bad.length, 'each on a new connection')
})

t.test('cut short: a reset before the answer, a body shorter than its length', async (t) => {
  const answers: ((string | Buffer)[] | 'close')[] = ['close', ['HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort']]
  let n = 0
  const s = await rawServer(t, (_r, conn) => {
    const a = answers[n++]!
    if (a !== 'close') setTimeout(() => conn.socket.destroy(), 30)
    return a
  })
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  t.match(await send(client, s.origin), { kind: 'network' })
  t.match(await send(client, s.origin), { kind: 'network' }, 'a body cut short is no answer')
})

t.test('the deadline: a hung server, a queued request, and the connection limit per origin', async (t) => {
  const s = await rawServer(t, (r) => (r.includes('hang') ? 'hang' : [ok()]))
  const client = new HttpClient({ connections: 1 })
  t.teardown(() => client.destroy())
  const hung = new Promise<HttpOutcome>((done) =>
    client.request(s.origin, { path: '/hang', headerLines: '', body: 'x', timeoutMs: 300, maxBodyBytes: 10, done }),
  )
  const queued = send(client, s.origin, 'y', { timeoutMs: 150 })
  t.same(await queued, { kind: 'timeout' }, 'waiting for the one connection counts towards the deadline')
  t.same(await hung, { kind: 'timeout' })
  t.match(await send(client, s.origin), { kind: 'answer', status: 200 }, 'a new connection replaces the one the deadline closed')
  t.equal(s.conns.length, 2)
})

t.test('a request is asked when its connection comes: refused, it ends unsent, nothing written', async (t) => {
  const s = await rawServer(t, (r) => (r.includes('first') ? 'hang' : [ok()]))
  const client = new HttpClient({ connections: 1 })
  t.teardown(() => client.destroy())
  const asked: string[] = []
  const request = (path: string, may: boolean) =>
    new Promise<HttpOutcome>((done) =>
      client.request(s.origin, {
        path,
        headerLines: '',
        body: path,
        timeoutMs: 5_000,
        maxBodyBytes: 10,
        mayStart: () => {
          asked.push(path)
          return may
        },
        done,
      }),
    )
  // The first takes the one connection (asked at once) and hangs until its socket goes.
  const first = request('/first', true)
  await waitUntil(() => (s.conns[0]?.requests.length ?? 0) > 0, 30_000, 'the first request written')
  const refused = request('/refused', false)
  const allowed = request('/allowed', true)
  s.conns[0]!.socket.destroy() // the first's connection goes: the queue moves on to a new one
  t.match(await first, { kind: 'network' })
  t.same(await refused, { kind: 'unsent' }, 'refused when its turn came')
  t.match(await allowed, { kind: 'answer', status: 200 }, 'the next one goes')
  t.same(asked, ['/first', '/refused', '/allowed'], 'each is asked when its connection comes, in their order')
  const written = s.conns.flatMap((c) => c.requests.map((r) => r.split(' ')[1]))
  t.same(written, ['/first', '/allowed'], 'nothing of the refused one was written')
})

t.test('refused with a connection free it ends unsent, not synchronously; queued ones end unsent at destroy', async (t) => {
  const s = await rawServer(t, () => 'hang')
  const client = new HttpClient({ connections: 1 })
  const ask = (path: string, may: boolean, done: (o: HttpOutcome) => void) =>
    client.request(s.origin, { path, headerLines: '', body: path, timeoutMs: 5_000, maxBodyBytes: 10, mayStart: () => may, done })
  let told: HttpOutcome | undefined
  ask('/now', false, (o) => {
    told = o
  })
  t.equal(told, undefined, 'not told from inside request()')
  await new Promise((r) => setImmediate(r))
  t.same(told, { kind: 'unsent' })
  const hung = new Promise<HttpOutcome>((done) => ask('/hung', true, done))
  await waitUntil(() => (s.conns[0]?.requests.length ?? 0) > 0, 30_000, 'the hung request written')
  const queued = new Promise<HttpOutcome>((done) => ask('/queued', true, done))
  client.destroy()
  t.match(await hung, { kind: 'network' }, 'the one written fails as a network error')
  t.same(await queued, { kind: 'unsent' }, 'the queued one was never written')
  t.same(
    s.conns.flatMap((c) => c.requests.map((r) => r.split(' ')[1])),
    ['/hung'],
  )
})

t.test('close() lets answers under way end, then takes no more', async (t) => {
  const s = await rawServer(t, () => [ok()], 50)
  const client = new HttpClient()
  const pending = send(client, s.origin)
  await new Promise((r) => setTimeout(r, 10))
  const closed = client.close()
  t.match(await pending, { kind: 'answer', status: 200 })
  await closed
  t.match(await send(client, s.origin), { kind: 'network' }, 'refused once closed')
})

t.test("https: the server's certificate is checked against the trusted ones; a self-signed one is refused", async (t) => {
  // A key and a self-signed certificate for 127.0.0.1 (valid for 100 years), made for this test with openssl.
  const pem = readFileSync(new URL('./self-signed-127.0.0.1.pem', import.meta.url), 'utf8')
  const server = tls.createServer({ key: pem, cert: pem }, (socket) => {
    socket.on('data', () => socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'))
    socket.on('error', () => {})
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => server.close())
  const port = (server.address() as net.AddressInfo).port
  const client = new HttpClient()
  t.teardown(() => client.destroy())
  const origin: Origin = { key: `https://127.0.0.1:${port}`, tls: true, hostname: '127.0.0.1', port, host: `127.0.0.1:${port}` }
  t.match(await send(client, origin), { kind: 'network', error: { code: 'DEPTH_ZERO_SELF_SIGNED_CERT' } })
})

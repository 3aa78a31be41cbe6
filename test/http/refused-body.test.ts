/**
 * A request refused before its body is read (413 for a body over HOOKQ_MAX_REQUEST_BYTES, 401 for a
 * bad key) must reach the client as that answer, not as a connection reset or EPIPE: a client that
 * sees only a broken connection cannot tell "too large" from "broker down" and retries for ever.
 * The broker runs as its own process: in this one, client and server would share an event loop,
 * and the server would read the body as fast as the client writes it, hiding the reset.
 */
import net from 'node:net'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { spawnBroker } from '../helpers/process.ts'

const MiB = 1024 * 1024

/** POSTs `body` with Node's fetch (undici); the answer, or the error fetch threw. */
async function post(url: string, body: Uint8Array | ReadableStream<Uint8Array>, headers: Record<string, string> = {}) {
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body,
      ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
    } as RequestInit)
    return { status: res.status, type: res.headers.get('content-type'), json: (await res.json()) as { code?: string; status?: number } }
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause
    return { error: `${(err as Error).message}: ${cause?.code ?? ''} ${cause?.message ?? ''}` }
  }
}

/** A body streamed in 64 KiB chunks without a content-length (chunked). */
function chunked(total: number): ReadableStream<Uint8Array> {
  const chunk = new Uint8Array(64 * 1024).fill(0x20)
  let sent = 0
  return new ReadableStream({
    pull(controller) {
      if (sent >= total) return controller.close()
      controller.enqueue(chunk)
      sent += chunk.length
    },
  })
}

/** The broker as a child process on a test database of its own; its URL. */
async function broker(t: Test, env: Record<string, string> = {}): Promise<string> {
  const b = await spawnBroker({ DATABASE_URL: (await testDatabase(t)).url, ...env })
  t.teardown(() => {
    b.child.kill('SIGKILL')
  })
  return b.url
}

/**
 * The broker with an API key, one process for the two tests that need it (the first starts it; it
 * ends with the file): nothing either test does changes what the other sees, each request being
 * refused before its body is read.
 */
let keyed: Promise<string> | undefined
const keyedBroker = (): Promise<string> => (keyed ??= broker(t, { HOOKQ_API_KEYS: 'the-right-key' }))

t.test('a body over the limit is answered 413 body_too_large, every time', { skip: needsServer }, async (t) => {
  const url = await broker(t) // HOOKQ_MAX_REQUEST_BYTES: 10 MiB by default
  const body = new Uint8Array(11 * MiB).fill(0x20)
  const answers = []
  for (let i = 0; i < 20; i++) answers.push(await post(`${url}/v1/topics/big/messages`, body))
  t.same(
    answers.filter((a) => a.status !== 413 || a.json?.code !== 'body_too_large'),
    [],
    'all 20 tries answered 413 body_too_large',
  )
  t.match(answers[0], { status: 413, type: /^application\/problem\+json/, json: { status: 413, code: 'body_too_large' } })

  const streamed = []
  for (let i = 0; i < 5; i++) streamed.push(await post(`${url}/v1/topics/big/messages`, chunked(11 * MiB)))
  t.same(
    streamed.filter((a) => a.status !== 413 || a.json?.code !== 'body_too_large'),
    [],
    'chunked, without content-length: 413 too',
  )

  // What is thrown away is bounded: a client claiming 1 GiB is cut off after 64 MiB or so.
  const { port } = new URL(url)
  const sock = net.connect({ host: '127.0.0.1', port: Number(port) })
  let answer = ''
  let written = 0
  sock.on('data', (d) => {
    answer += d
  })
  sock.on('error', () => {})
  const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()))
  let open = true
  void closed.then(() => {
    open = false
  })
  sock.write(`POST /v1/topics/big/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${1024 * MiB}\r\n\r\n`)
  const chunk = Buffer.alloc(MiB, 0x20)
  while (open && written < 1024 * MiB) {
    written += chunk.length
    if (!sock.write(chunk)) {
      await new Promise<void>((resolve) => {
        const done = () => {
          sock.off('drain', done)
          sock.off('close', done)
          resolve()
        }
        sock.on('drain', done).on('close', done)
      })
    }
  }
  await closed
  t.match(answer, /^HTTP\/1\.1 413 /, 'the 413 came first')
  t.ok(written < 256 * MiB, `the broker cut the connection after ${written / MiB} MiB of a 1 GiB body`)

  t.match(
    await post(`${url}/v1/topics/big/messages`, new TextEncoder().encode('{"messages":[{"value":1}]}')),
    { status: 404, json: { code: 'topic_not_found' } },
    'the broker still serves',
  )
})

t.test('a big body with a bad key is answered 401, every time', { skip: needsServer }, async (t) => {
  const url = await keyedBroker()
  const body = new Uint8Array(8 * MiB).fill(0x20)
  const answers = []
  for (let i = 0; i < 5; i++) answers.push(await post(`${url}/v1/topics/big/messages`, body, { authorization: 'Bearer a-wrong-key' }))
  for (let i = 0; i < 3; i++)
    answers.push(await post(`${url}/v1/topics/big/messages`, chunked(8 * MiB), { authorization: 'Bearer a-wrong-key' }))
  t.same(
    answers.filter((a) => a.status !== 401 || a.json?.code !== 'unauthorized'),
    [],
    'all 8 tries answered 401 unauthorized',
  )
})

/**
 * Sends `head` and then `bodyBytes` of body over a raw socket as fast as the broker takes them,
 * until the broker closes; the bytes it answered, and the socket error if there was one.
 */
async function rawPost(url: string, head: string, bodyBytes: number): Promise<{ answer: string; error?: string }> {
  const { port } = new URL(url)
  const sock = net.connect({ host: '127.0.0.1', port: Number(port) })
  let answer = ''
  let error: string | undefined
  sock.on('data', (d) => {
    answer += d
  })
  sock.on('error', (err: NodeJS.ErrnoException) => {
    error = err.code ?? err.message
  })
  let open = true
  const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()))
  void closed.then(() => {
    open = false
  })
  sock.write(head)
  const chunk = Buffer.alloc(256 * 1024, 0x20)
  for (let written = 0; open && written < bodyBytes; written += chunk.length) {
    if (!sock.write(chunk)) {
      await new Promise<void>((resolve) => {
        const done = () => {
          sock.off('drain', done)
          sock.off('close', done)
          resolve()
        }
        sock.on('drain', done).on('close', done)
      })
    }
  }
  if (open) sock.end()
  await closed
  return error === undefined ? { answer } : { answer, error }
}

t.test('with Connection: close, an early 413 or 401 still reaches the client, every time', { skip: needsServer }, async (t) => {
  const url = await keyedBroker()
  const head = (auth: string, length: number) =>
    'POST /v1/topics/big/messages HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n' +
    `authorization: Bearer ${auth}\r\ncontent-length: ${length}\r\n\r\n`
  const tries: { what: string; answer: string; error?: string }[] = []
  for (let i = 0; i < 10; i++) {
    tries.push({ what: '413', ...(await rawPost(url, head('the-right-key', 11 * MiB), 11 * MiB)) })
    tries.push({ what: '401', ...(await rawPost(url, head('a-wrong-key', 8 * MiB), 8 * MiB)) })
  }
  const wrong = tries.filter((r) => !r.answer.startsWith(`HTTP/1.1 ${r.what} `) || !/\r\nconnection: close\r\n/i.test(r.answer))
  t.same(
    wrong.map((r) => ({ ...r, answer: r.answer.slice(0, 400) })),
    [],
    'all 20 answered with their status and connection: close, none reset before it',
  )
  t.notOk(
    tries.some((r) => r.error !== undefined),
    'and the connection ended without a reset',
  )
})

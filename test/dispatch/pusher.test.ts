import t from '../helpers/tap.ts'
import net from 'node:net'
import { createPushAgent, parseRetryAfterMs, push, type PushRequest } from '../../src/dispatch/pusher.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const agent = createPushAgent()
t.teardown(() => agent.destroy())

const BODY = JSON.stringify({ deliveryId: 'd-1', value: { n: 1 } })
const request = (url: string, extra: Partial<PushRequest> = {}): PushRequest => ({
  url,
  body: BODY,
  headers: { 'content-type': 'application/json', 'webhook-id': 'msg-1' },
  timeoutMs: 2_000,
  ...extra,
})

/** A loopback port with nothing listening on it. */
async function closedPort(): Promise<number> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}

t.test('2xx is delivered: the POST arrives intact and the answer body is kept', async (t) => {
  const receiver = await startReceiver(t, { status: 200, body: 'thanks' })
  const result = await push(agent, request(`${receiver.url}/hooks/orders?x=1`))
  t.match(result, { kind: 'delivered', status: 200, body: 'thanks' })
  t.ok(result.durationMs >= 0 && result.durationMs < 2_000)
  const [got] = receiver.requests
  t.match(got, { method: 'POST', path: '/hooks/orders?x=1', body: BODY, json: { deliveryId: 'd-1' } })
  t.match(got?.headers, { 'content-type': 'application/json', 'webhook-id': 'msg-1' })

  receiver.setBehaviour({ status: 204, body: '' })
  t.match(await push(agent, request(receiver.url, { body: Buffer.from('{"raw":true}') })), { kind: 'delivered', status: 204, body: '' })
  t.equal(receiver.requests[1]?.body, '{"raw":true}', 'a Buffer body is sent as is')
})

t.test('the answer body is cut at maxResponseBytes (default 4 KiB)', async (t) => {
  const receiver = await startReceiver(t, { status: 200, body: 'a'.repeat(10_000) })
  const result = await push(agent, request(receiver.url))
  t.match(result, { kind: 'delivered', status: 200 })
  t.equal(result.kind === 'delivered' && result.body, 'a'.repeat(4096))
  t.match(await push(agent, request(receiver.url, { maxResponseBytes: 10 })), { kind: 'delivered', body: 'a'.repeat(10) })
  receiver.setBehaviour({ status: 500, body: 'e'.repeat(10_000) })
  t.match(await push(agent, request(receiver.url, { maxResponseBytes: 5 })), { kind: 'rejected', status: 500, body: 'eeeee' })
})

t.test('non-2xx answers are rejected with their status and body', async (t) => {
  const receiver = await startReceiver(t, { status: 500, body: 'boom' })
  t.match(await push(agent, request(receiver.url)), { kind: 'rejected', status: 500, body: 'boom' })
  receiver.setBehaviour({ status: 410, body: 'gone' })
  const gone = await push(agent, request(receiver.url))
  t.match(gone, { kind: 'rejected', status: 410, body: 'gone' })
  t.notOk('retryAfterMs' in gone, 'no Retry-After outside 429/503')
  receiver.setBehaviour({ status: 400, headers: { 'retry-after': '5' } })
  t.notOk('retryAfterMs' in (await push(agent, request(receiver.url))), 'Retry-After on a 400 is ignored')
})

t.test('a redirect is rejected and never followed', async (t) => {
  const target = await startReceiver(t)
  const receiver = await startReceiver(t, { redirectTo: `${target.url}/elsewhere` })
  t.match(await push(agent, request(receiver.url)), { kind: 'rejected', status: 302 })
  t.equal(target.requests.length, 0, 'the redirect target received nothing')
  receiver.setBehaviour({ status: 307, headers: { location: target.url } })
  t.match(await push(agent, request(receiver.url)), { kind: 'rejected', status: 307 })
  t.equal(target.requests.length, 0)
})

t.test('Retry-After on 429 and 503, as delta-seconds and as an HTTP-date', async (t) => {
  const receiver = await startReceiver(t, { status: 429, headers: { 'retry-after': '2' } })
  t.match(await push(agent, request(receiver.url)), { kind: 'rejected', status: 429, retryAfterMs: 2000 })

  receiver.setBehaviour(() => ({ status: 503, headers: { 'retry-after': new Date(Date.now() + 3_000).toUTCString() } }))
  const dated = await push(agent, request(receiver.url))
  t.match(dated, { kind: 'rejected', status: 503 })
  const retryAfterMs = dated.kind === 'rejected' ? (dated.retryAfterMs ?? -1) : -1
  t.ok(retryAfterMs > 1_000 && retryAfterMs <= 3_000, `HTTP-date 3 s ahead (whole seconds): ${retryAfterMs} ms`)

  receiver.setBehaviour({ status: 503 })
  t.notOk('retryAfterMs' in (await push(agent, request(receiver.url))), 'none without the header')
  receiver.setBehaviour({ status: 429, headers: { 'retry-after': 'soon' } })
  t.notOk('retryAfterMs' in (await push(agent, request(receiver.url))), 'none when unparsable')
})

t.test('parseRetryAfterMs', async (t) => {
  const nowMs = Date.parse('2026-11-30T06:00:00.000Z')
  t.equal(parseRetryAfterMs('120', nowMs), 120_000)
  t.equal(parseRetryAfterMs(' 0 ', nowMs), 0)
  t.equal(parseRetryAfterMs('Mon, 30 Nov 2026 06:00:30 GMT', nowMs), 30_000)
  t.equal(parseRetryAfterMs('Mon, 30 Nov 2026 05:00:00 GMT', nowMs), 0, 'a past date means now')
  t.equal(parseRetryAfterMs(['7', '9'], nowMs), 7_000)
  t.equal(parseRetryAfterMs('-5', nowMs), undefined)
  t.equal(parseRetryAfterMs('1.5', nowMs), undefined)
  t.equal(parseRetryAfterMs('', nowMs), undefined)
  t.equal(parseRetryAfterMs(undefined, nowMs), undefined)
})

t.test('no answer within timeoutMs is a timeout, close to the deadline', async (t) => {
  const receiver = await startReceiver(t, { hang: true })
  const result = await push(agent, request(receiver.url, { timeoutMs: 300 }))
  t.match(result, { kind: 'timeout' })
  t.ok(result.durationMs >= 295 && result.durationMs < 3_300, `timed out after ${result.durationMs} ms`)
  await waitUntil(() => receiver.requests[0]?.closed, 2_000, 'the hung request to be abandoned')

  receiver.setBehaviour({ delayMs: 600, status: 200 })
  t.match(await push(agent, request(receiver.url, { timeoutMs: 300 })), { kind: 'timeout' }, 'a late answer is a timeout')
  receiver.setBehaviour({ delayMs: 100, status: 200 })
  t.match(await push(agent, request(receiver.url, { timeoutMs: 2_000 })), { kind: 'delivered' }, 'a slow answer in time is delivered')
})

t.test('a body dripping past the deadline is a timeout', async (t) => {
  const receiver = await startReceiver(t, { status: 200, dripMs: 50 })
  const result = await push(agent, request(receiver.url, { timeoutMs: 400 }))
  t.match(result, { kind: 'timeout' })
  t.ok(result.durationMs >= 395 && result.durationMs < 3_400, `timed out after ${result.durationMs} ms`)
  t.ok((receiver.requests[0]?.sentBytes ?? 0) > 0, 'headers and some body had arrived')
})

t.test('an endless 2xx body is delivered, cut at the cap, without growing memory', async (t) => {
  const receiver = await startReceiver(t, { status: 200, endlessBody: true })
  const rssBefore = process.memoryUsage().rss
  const result = await push(agent, request(receiver.url, { timeoutMs: 5_000 }))
  t.match(result, { kind: 'delivered', status: 200 })
  t.equal(result.kind === 'delivered' && result.body.length, 4096)
  t.ok(result.durationMs < 2_000, `returned after ${result.durationMs} ms`)
  const received = await waitUntil(
    () => (receiver.requests[0]?.closed ? receiver.requests[0] : undefined),
    2_000,
    'the receiver to see the client go',
  )
  t.ok(received.sentBytes < 32 * 1024 * 1024, `receiver wrote ${received.sentBytes} bytes before the client left`)
  const grownMb = (process.memoryUsage().rss - rssBefore) / 2 ** 20
  t.ok(grownMb < 64, `rss grew ${grownMb.toFixed(1)} MiB`)

  receiver.setBehaviour({ status: 503, endlessBody: true, headers: { 'retry-after': '1' } })
  t.match(await push(agent, request(receiver.url)), { kind: 'rejected', status: 503, retryAfterMs: 1000 }, 'still classified by status')
})

t.test('network failures: refused, reset, bad URL', async (t) => {
  const refused = await push(agent, request(`http://127.0.0.1:${await closedPort()}/`))
  t.match(refused, { kind: 'network', error: /ECONNREFUSED/ })

  const receiver = await startReceiver(t, { reset: true })
  const reset = await push(agent, request(receiver.url))
  t.match(reset, { kind: 'network', error: /\S/ })
  t.equal(receiver.requests.length, 1)

  t.match(await push(agent, request('not a url')), { kind: 'network' }, 'never throws')
  t.match(await push(agent, request('ftp://127.0.0.1/')), { kind: 'network' })
})

t.test('keep-alive: sequential pushes to one consumer reuse one socket', async (t) => {
  const own = createPushAgent()
  t.teardown(() => own.destroy())
  const receiver = await startReceiver(t, { status: 200, body: 'ok' })
  // A turn of the event loop between pushes, as between pushes of a real consumer's partition.
  const nextTurn = () => new Promise((resolve) => setImmediate(resolve))
  for (let i = 0; i < 3; i++) {
    t.match(await push(own, request(receiver.url)), { kind: 'delivered' })
    await nextTurn()
  }
  const ports = receiver.requests.map((r) => r.remotePort)
  t.equal(new Set(ports).size, 1, `one client port: ${ports.join(', ')}`)

  // A body cut at the cap while still streaming cannot be left half-read on a pooled socket: that
  // socket is closed. A small one that arrived whole is already complete, so its socket stays.
  receiver.setBehaviour({ status: 200, body: 'x'.repeat(100) })
  t.match(await push(own, request(receiver.url, { maxResponseBytes: 10 })), { kind: 'delivered', body: 'x'.repeat(10) })
  await nextTurn()
  receiver.setBehaviour({ status: 200, body: 'x'.repeat(1 << 20) })
  t.match(await push(own, request(receiver.url)), { kind: 'delivered' })
  await nextTurn()
  receiver.setBehaviour({ status: 200, body: 'ok' })
  t.match(await push(own, request(receiver.url)), { kind: 'delivered' })
  const [small, large, after] = receiver.requests.slice(3).map((r) => r.remotePort)
  t.equal(small, ports[0], 'a short body cut at the cap but fully received keeps the socket')
  t.equal(large, ports[0])
  t.not(after, ports[0], 'a new socket after a body cut mid-stream')
})

t.test('waiting for a pooled connection counts towards the deadline', async (t) => {
  const single = createPushAgent({ connections: 1 })
  t.teardown(() => single.destroy())
  const receiver = await startReceiver(t, (req) => (req.path === '/hang' ? { hang: true } : { status: 200 }))
  const hung = push(single, request(`${receiver.url}/hang`, { timeoutMs: 1_000 }))
  await receiver.waitFor(1)
  const queued = await push(single, request(`${receiver.url}/fast`, { timeoutMs: 300 }))
  t.match(queued, { kind: 'timeout' })
  t.match(await hung, { kind: 'timeout' })
})

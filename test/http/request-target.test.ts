/**
 * A request whose target names a host (absolute-form, `POST http://10.0.0.5/v1/...`) is refused
 * with 400: the router would take it, and a forwarded ack built from it would go to that host.
 * And behind that guard, forwarding itself (acks sent on to the process that owns a partition)
 * takes only the path and query of the target: the owner's URL is the one place its host comes from.
 */
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import net from 'node:net'
import Fastify from 'fastify'
import t from '../helpers/tap.ts'
import { installForwarding } from '../../src/http/forward.ts'
import { newDeliveryId } from '../../src/core/delivery-id.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

/** Sends one raw HTTP/1.1 request and returns the status line's code. */
function rawStatus(url: string, requestLine: string): Promise<number> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname, () => {
      const body = requestLine.startsWith('POST')
        ? { headers: 'content-type: application/json\r\ncontent-length: 2\r\n', text: '{}' }
        : { headers: '', text: '' }
      socket.write(`${requestLine}\r\nhost: ${hostname}:${port}\r\n${body.headers}connection: close\r\n\r\n${body.text}`)
    })
    let text = ''
    socket.on('data', (d) => {
      text += d.toString('latin1')
    })
    socket.on('end', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)))
    socket.on('error', reject)
  })
}

t.test('absolute-form request targets are refused; origin-form ones are served', async (t) => {
  const { url } = await startListeningBroker(t)
  t.equal(await rawStatus(url, 'POST http://127.0.0.1:9/v1/groups/g/acks HTTP/1.1'), 400, 'a target naming another host: 400')
  t.equal(await rawStatus(url, 'GET http://127.0.0.1:9/v1/topics HTTP/1.1'), 400, 'also for a GET')
  t.equal(await rawStatus(url, 'GET /v1/topics HTTP/1.1'), 200, 'a path is served')
})

/** A server on 127.0.0.1 that records each request's target and host, answering acks with `results`. */
async function recorder(t: { teardown(fn: () => unknown): void }) {
  const seen: { url: string; host: string | undefined; forwarded: string | undefined }[] = []
  const server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (c) => {
      body += c
    })
    req.on('end', () => {
      seen.push({ url: req.url ?? '', host: req.headers.host, forwarded: req.headers['hookq-forwarded'] as string | undefined })
      const ids = (JSON.parse(body || '{}') as { deliveryIds?: string[] }).deliveryIds ?? []
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ results: ids.map((deliveryId) => ({ deliveryId, status: 'acked' })) }))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  return { seen, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
}

t.test('a forwarded ack goes to the owner with the path and query only, whatever the target named', async (t) => {
  const owner = await recorder(t)
  const elsewhere = await recorder(t)
  // An app with forwarding and an ack route, without the broker's origin-form guard: forwarding
  // must be safe on its own.
  const app = Fastify()
  installForwarding(app, { alone: false, ownerOf: () => owner.url, partitionsOf: () => 1 })
  app.post('/v1/groups/:group/acks', async (req) => ({
    results: (req.body as { deliveryIds: string[] }).deliveryIds.map((id) => ({ deliveryId: id, status: 'acked' })),
  }))
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => app.close())
  const id = newDeliveryId({ groupId: 1, partition: 0, offset: 7, attempt: 1 })
  const body = JSON.stringify({ deliveryIds: [id] })
  const { port } = new URL(base)
  const { host: elsewhereHost } = new URL(elsewhere.url)
  for (const target of [`/v1/groups/g/acks?trace=1`, `http://${elsewhereHost}/v1/groups/g/acks?trace=1`]) {
    const before = owner.seen.length
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(port), '127.0.0.1', () => {
        socket.write(
          `POST ${target} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
        )
      })
      let text = ''
      socket.on('data', (d) => {
        text += d.toString('latin1')
      })
      socket.on('end', () => resolve(text))
      socket.on('error', reject)
    })
    t.match(answer, /^HTTP\/1\.1 200/, `${target}: answered`)
    await waitUntil(() => owner.seen.length > before, 10_000, 'the owner to get the forwarded ack')
    const got = owner.seen.at(-1)!
    t.equal(got.url, '/v1/groups/g/acks?trace=1', `${target}: the owner got the path and query`)
    t.equal(got.host, new URL(owner.url).host, "and its own host: the owner's URL, never the target's")
    t.equal(got.forwarded, '1')
  }
  t.same(elsewhere.seen, [], 'the host the target named got nothing')
})

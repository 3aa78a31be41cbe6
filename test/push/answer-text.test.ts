/**
 * A consumer's answer is quoted into the attempt log's error text, and it is the consumer's to
 * choose: one with NUL (which PostgreSQL text cannot hold) must still be recorded, and must not
 * stall the log for the attempts written with it.
 */
import net from 'node:net'
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('an answer with NUL is recorded, the NUL as U+FFFD, and the log goes on', async (t) => {
  const broker = await startBroker(t)
  const call = async (method: string, url: string, payload?: unknown) =>
    (await broker.app.inject({ method: method as 'GET', url, ...(payload === undefined ? {} : { payload: payload as object }) })).json()
  await call('PUT', '/v1/topics/nul', { partitions: 1 })
  await call('PUT', '/v1/groups/nul-g', { topic: 'nul', ackMode: 'auto', maxDeliveries: 1 })
  const receiver = await startReceiver(t, (req) =>
    (req.json as { value: string }).value === 'bad' ? { status: 500, body: 'before\u0000after' } : { status: 200 },
  )
  await call('POST', '/v1/groups/nul-g/consumers', { url: receiver.url })
  await call('POST', '/v1/topics/nul/messages', { messages: [{ value: 'bad' }, { value: 'good' }] })

  type Row = { offset: number; outcome: string; error: string | null; statusCode: number | null }
  const rows = await waitUntil(
    async () => {
      const list = (await call('GET', '/v1/groups/nul-g/deliveries')).deliveries as Row[]
      // The failed attempt is written first, then marked dead once the message is dead-lettered.
      return list.length === 2 && list.every((d) => d.outcome === (d.offset === 0 ? 'dead' : 'acked')) ? list : undefined
    },
    15_000,
    'both attempts recorded with their final outcomes',
  )
  const bad = rows.find((d) => d.offset === 0)!
  t.match(bad, { outcome: 'dead', statusCode: 500, error: 'HTTP 500: before\uFFFDafter' })
  t.match(
    rows.find((d) => d.offset === 1),
    { outcome: 'acked', statusCode: 200 },
  )
})

/**
 * A consumer that answers as no well-behaved server would: a NUL in its status text and body,
 * bytes that are not UTF-8, a four-byte character where the quoted body is cut (a lone surrogate),
 * then a header whose NUL the protocol error quotes. Served over a raw socket: node:http refuses
 * to write any of it. Answers after the request's body has arrived, then closes.
 */
async function hostileConsumer(t: { teardown(fn: () => unknown): void }): Promise<{ url: string; requests: () => number }> {
  let n = 0
  // The error quotes 200 UTF-16 units of the body: 8 before this, 191 x, then half of the pair.
  const cut = Buffer.from(`${'x'.repeat(191)}😀tail`)
  const body = Buffer.concat([Buffer.from('a\u0000b'), Buffer.from([0xff, 0xfe, 0x80, 0x20, 0x20]), cut])
  const answers = [
    Buffer.concat([Buffer.from(`HTTP/1.1 500 Bad\u0000Reason\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`), body]),
    Buffer.from('HTTP/1.1 502 Bad\r\ntransfer-encoding: gz\u0000ip\r\nconnection: close\r\n\r\n'),
  ]
  const server = net.createServer((socket) => {
    let head = Buffer.alloc(0)
    socket.on('error', () => {})
    socket.on('data', (chunk) => {
      head = Buffer.concat([head, chunk])
      const end = head.indexOf('\r\n\r\n')
      if (end < 0) return
      const length = Number(/content-length: *(\d+)/i.exec(head.subarray(0, end).toString('latin1'))?.[1] ?? 0)
      if (head.length < end + 4 + length) return
      socket.removeAllListeners('data')
      socket.end(answers[Math.min(n++, answers.length - 1)]!)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())))
  return { url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/hook`, requests: () => n }
}

t.test(
  'NUL, bad UTF-8 and a cut pair from a consumer: its attempts, health and dead letter are stored, and a healthy consumer’s health too',
  async (t) => {
    const broker = await startBroker(t)
    const { call, produce, groupStatus, allCompleted } = api(broker)
    t.equal((await call('PUT', '/v1/topics/hostile', { partitions: 1 })).status, 201)
    t.equal((await call('PUT', '/v1/topics/hostile-dlq', { partitions: 1 })).status, 201)
    const retry = { initialDelayMs: 10, maxDelayMs: 10, jitter: 0 }
    const bad = { topic: 'hostile', ackMode: 'auto', maxDeliveries: 2, retry, deadLetterTopic: 'hostile-dlq' }
    t.equal((await call('PUT', '/v1/groups/hostile-bad', bad)).status, 201)
    t.equal((await call('PUT', '/v1/groups/hostile-good', { topic: 'hostile', ackMode: 'auto' })).status, 201)
    const hostile = await hostileConsumer(t)
    const receiver = await startReceiver(t, { status: 200 })
    const badId = (await call('POST', '/v1/groups/hostile-bad/consumers', { url: hostile.url })).json.id as string
    const goodId = (await call('POST', '/v1/groups/hostile-good/consumers', { url: receiver.url })).json.id as string

    t.equal((await produce('hostile', [{ value: 'one' }])).status, 201)
    await allCompleted('hostile-bad', 20_000)
    await allCompleted('hostile-good', 20_000)
    t.equal(hostile.requests(), 2, 'both answers were given')

    type Row = { attempt: number; outcome: string; error: string | null; statusCode: number | null }
    const rows = await waitUntil(
      async () => {
        const list = (await call('GET', '/v1/groups/hostile-bad/deliveries')).json.deliveries as Row[]
        return list.length === 2 && list.some((d) => d.outcome === 'dead') ? list : undefined
      },
      15_000,
      'both attempts of the hostile consumer recorded',
    )
    const first = rows.find((d) => d.attempt === 1)!
    const second = rows.find((d) => d.attempt === 2)!
    t.equal(first.statusCode, 500)
    t.equal(first.error, `HTTP 500: a\uFFFDb\uFFFD\uFFFD\uFFFD  ${'x'.repeat(191)}\uFFFD`, 'NUL, bad bytes and the cut pair as U+FFFD')
    t.match(second.error, /Transfer-Encoding: gz\uFFFDip/, "the protocol error's NUL as U+FFFD")

    type Health = { lastError: string | null; lastFailureAt: string | null; lastSuccessAt: string | null }
    const healthOf = async (group: string, id: string): Promise<Health> =>
      (await groupStatus(group)).consumers.find((c: { id: string }) => c.id === id).health
    const badHealth = await waitUntil(
      async () => {
        const h = await healthOf('hostile-bad', badId)
        return h.lastFailureAt ? h : undefined
      },
      10_000,
      "the hostile consumer's health written",
    )
    t.match(badHealth.lastError, /^HTTP 502|Transfer-Encoding: gz\uFFFDip/)
    t.notOk(badHealth.lastError?.includes('\u0000'))
    await waitUntil(
      async () => (await healthOf('hostile-good', goodId)).lastSuccessAt !== null,
      10_000,
      "the healthy consumer's health written",
    )

    const dead = (await call('GET', '/v1/topics/hostile-dlq/partitions/0/messages?fromOffset=0')).json.messages
    t.equal(dead.length, 1, 'dead-lettered')
    t.match(dead[0].headers['hookq-dlq-error'], /Transfer-Encoding: gz\uFFFDip/, 'the dead letter names the error, NUL as U+FFFD')
  },
)

/**
 * The consumer helper with batch pushes (a group with `batch`), against the real broker: the
 * signature is verified over the batch, the handler runs per message in order (or the batch
 * handler once), and the answer names the messages that failed, which alone are pushed again; in
 * explicit mode each message is acked or nacked by its own delivery id.
 */
import t from '../helpers/tap.ts'
import { createConsumer, type PushMessage } from '@hookq/client/consumer'
import { generateSecret } from '../../src/core/signature.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { sdkApi, serve } from '../helpers/sdk.ts'
import { waitUntil } from '../helpers/wait.ts'

const { url } = await startListeningBroker(t)
const { setupWithConsumer, produceValues, lagZero, deliveries } = sdkApi(url)
const range = (n: number) => Array.from({ length: n }, (_, i) => i)

const retry = { initialDelayMs: 10, maxDelayMs: 10, multiplier: 1, jitter: 0 }

for (const ackMode of ['auto', 'explicit'] as const) {
  t.test(`${ackMode} mode: per message, in order; only the failed ones come back`, async (t) => {
    const secret = generateSecret()
    const calls: { value: number; attempt: number; batch: string }[] = []
    const consumer = createConsumer<number>({
      secret,
      ackMode,
      baseUrl: url,
      onError: () => {},
      handler: (m: PushMessage<number>, ctx) => {
        calls.push({ value: m.value, attempt: m.attempt, batch: String((ctx.requestHeaders as Record<string, string>)['webhook-id']) })
        if (m.value % 3 === 0 && m.attempt === 1) throw new Error(`not yet: ${m.value}`)
      },
    })
    const name = `cb-${ackMode}`
    await setupWithConsumer(
      name,
      { batch: { maxMessages: 25 }, ackMode, retry, maxDeliveries: 5 },
      await serve(t, consumer.listener),
      secret,
    )
    await produceValues(name, range(30))
    await lagZero(name)
    const firsts = calls.filter((c) => c.attempt === 1).map((c) => c.value)
    t.same(
      [...firsts].sort((a, b) => a - b),
      Array.from({ length: 30 }, (_, i) => i),
      'every message once at attempt 1',
    )
    const batches = new Map<string, number[]>()
    for (const c of calls) batches.set(c.batch, [...(batches.get(c.batch) ?? []), c.value])
    t.ok(
      [...batches.values()].every((vs) => vs.every((v, i) => i === 0 || v > vs[i - 1]!)),
      'in offset order within each batch',
    )
    t.ok(
      [...batches.values()].some((vs) => vs.length > 1),
      'several messages a batch',
    )
    t.same(
      calls
        .filter((c) => c.attempt > 1)
        .map((c) => c.value)
        .sort((a, b) => a - b),
      [0, 3, 6, 9, 12, 15, 18, 21, 24, 27],
      'again only the ones that failed',
    )
    // The attempt log is written in batches: its last outcomes may trail the committed offset a little.
    const ackedRows = async () => (await deliveries(name)).filter((d) => d.outcome === 'acked')
    const rows = await waitUntil(
      async () => {
        const r = await ackedRows()
        return r.length >= 30 ? r : undefined
      },
      10_000,
      '30 acked attempt rows',
    )
    t.equal(new Set(rows.map((d) => d.offset)).size, 30, 'each message acked once')
    t.equal(rows.length, 30)
  })
}

t.test('a batch handler gets the whole batch and names what failed', async (t) => {
  const secret = generateSecret()
  const batches: number[][] = []
  const consumer = createConsumer<number>({
    secret,
    ackMode: 'explicit',
    baseUrl: url,
    onError: () => {},
    handler: () => {
      throw new Error('not used')
    },
    batchHandler: (messages) => {
      batches.push(messages.map((m) => m.value))
      return { failed: messages.filter((m) => m.value === 7 && m.attempt === 1).map((m) => m.deliveryId) }
    },
  })
  await setupWithConsumer('cb-batch', { batch: { maxMessages: 25 }, ackMode: 'explicit', retry }, await serve(t, consumer.listener), secret)
  await produceValues('cb-batch', range(10))
  await lagZero('cb-batch')
  t.same(
    batches.flat().sort((a, b) => a - b),
    [0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9],
    'every message once, and 7 again',
  )
  t.ok(
    batches.some((b) => b.length > 1),
    'several messages a call',
  )
})

t.test('a batch whose signature does not verify runs nothing', async (t) => {
  const consumer = createConsumer({
    secret: generateSecret(),
    onError: () => {},
    handler: () => {
      t.fail('ran')
    },
  })
  const answer = await consumer.handle({
    headers: {
      'webhook-id': 'batch_x',
      'webhook-timestamp': String(Math.floor(Date.now() / 1000)),
      'webhook-signature': 'v1,AAAA',
      'hookq-signature': 'v1,AAAA',
    },
    body: '{"deliveries":[]}',
  })
  t.equal(answer.status, 401)
})

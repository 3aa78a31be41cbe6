/**
 * The SDK's pull consumer loop against a real broker: it acks what the handler took, nacks what it
 * threw on (the message comes again, attempt 2), and extends a lease while a slow handler runs (the
 * message is not leased again meanwhile).
 */
import t from '../helpers/tap.ts'
import { createClient } from '@hookq/client'
import { createPullConsumer, type PulledMessage } from '@hookq/client/consumer'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

const { url } = await startListeningBroker(t)
const client = createClient({ baseUrl: url, apiKey: '' })
const put = (path: string, body: unknown) =>
  fetch(url + path, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
await put('/v1/topics/work', { partitions: 2 })
await put('/v1/groups/workers', { topic: 'work', delivery: 'pull', retry: { initialDelayMs: 0, multiplier: 1, maxDelayMs: 0, jitter: 0 } })

t.test('ack, nack on a throw, extend while the handler runs', async (t) => {
  const seen: PulledMessage[] = []
  const errors: string[] = []
  const consumer = createPullConsumer<string>({
    client,
    group: 'workers',
    maxMessages: 10,
    waitMs: 1000,
    leaseMs: 1000,
    onError: (err, stage) => errors.push(`${stage}: ${String(err)}`),
    async handler(m) {
      seen.push(m)
      if (m.value === 'flaky' && m.attempt === 1) throw new Error('first time fails')
      // Slower than its 1 s lease: the loop extends it.
      if (m.value === 'slow') await new Promise((r) => setTimeout(r, 2500))
    },
  })
  t.teardown(() => consumer.stop())
  await fetch(`${url}/v1/topics/work/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ value: 'ok' }, { value: 'flaky' }, { value: 'slow' }] }),
  })
  await waitUntil(
    () => seen.some((m) => m.value === 'flaky' && m.attempt === 2) && seen.some((m) => m.value === 'slow'),
    30_000,
    'the retry',
  )
  const status = async () => (await (await fetch(`${url}/v1/groups/workers`)).json()) as { partitions: { lag: number; inFlight: number }[] }
  await waitUntil(async () => (await status()).partitions.every((p) => p.inFlight === 0), 30_000, 'every message settled')
  await consumer.stop()
  t.equal(consumer.state, 'stopped')
  t.same(
    seen.map((m) => `${m.value}#${m.attempt}`).sort(),
    ['flaky#1', 'flaky#2', 'ok#1', 'slow#1'],
    'the slow message was extended (not leased again), the flaky one nacked and retried',
  )
  t.same(errors, ['handler: Error: first time fails'])
})

t.test("stop() while a pull's answer is on its way: the messages in it are handled and acked, not left to expire", async (t) => {
  await put('/v1/topics/stopping', { partitions: 1 })
  await put('/v1/groups/stopping', { topic: 'stopping', delivery: 'pull', ackTimeoutMs: 120_000 })
  const handled: string[] = []
  let consumer: ReturnType<typeof createPullConsumer> | undefined
  let stopped: Promise<void> | undefined
  // stop() is called the moment the pull's answer (its headers) arrives, before its body is read.
  const stopOnAnswer = createClient({ baseUrl: url, apiKey: '' })
  stopOnAnswer.use({
    onResponse({ request, response }) {
      if (request.url.endsWith('/pull') && response.ok && consumer) stopped ??= consumer.stop()
    },
  })
  consumer = createPullConsumer<string>({
    client: stopOnAnswer,
    group: 'stopping',
    maxMessages: 10,
    waitMs: 20_000,
    onError: (err, stage) => t.fail(`${stage}: ${String(err)}`),
    handler(m) {
      handled.push(m.value)
    },
  })
  await fetch(`${url}/v1/topics/stopping/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ value: 'last' }] }),
  })
  await waitUntil(() => stopped !== undefined, 30_000, 'a pull answered')
  await stopped
  t.equal(consumer.state, 'stopped')
  t.same(handled, ['last'], 'the leased message was handled on stop')
  const status = (await (await fetch(`${url}/v1/groups/stopping`)).json()) as {
    partitions: { committedOffset: number; inFlight: number }[]
  }
  t.same(
    status.partitions.map((p) => [p.committedOffset, p.inFlight]),
    [[1, 0]],
    'acked: not waiting out its lease',
  )
})

/**
 * The generated SDK against the real broker over HTTP: a whole flow (topic, group, consumer,
 * produce, push to a real receiver, ack, status, attempt log), and an error answer as a typed
 * problem document and a thrown HookqError.
 */
import t from '../helpers/tap.ts'
import { createClient, unwrap, HookqError } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

// One broker for the flow and the error answers (nothing either does changes what the other sees);
// the API-key test has a broker of its own, configured with a key.
const { url } = await startListeningBroker(t)

t.test('a full flow through the SDK', async (t) => {
  const receiver = await startReceiver(t)
  const hookq = createClient({ baseUrl: url })

  const topic = await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'orders' } }, body: { partitions: 2 } }))
  t.equal(topic.partitions, 2)

  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'billing' } },
      body: { topic: 'orders', ackMode: 'explicit', ackTimeoutMs: 30_000 },
    }),
  )
  const consumer = await unwrap(
    hookq.POST('/v1/groups/{group}/consumers', {
      params: { path: { group: 'billing' } },
      body: { url: `${receiver.url}/hook` },
    }),
  )
  t.match(consumer, { id: String, url: `${receiver.url}/hook` })

  const produced = await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'orders' } },
      body: {
        messages: [
          { key: 'a', value: { n: 1 } },
          { key: 'b', value: { n: 2 } },
          { key: 'c', value: { n: 3 } },
        ],
      },
    }),
  )
  t.equal(produced.results.length, 3)

  const pushes = await receiver.waitFor(3, 15_000)
  const ids = pushes.map((p) => (p.json as { deliveryId: string }).deliveryId)
  t.same(pushes.map((p) => (p.json as { value: { n: number } }).value.n).sort(), [1, 2, 3])

  const acked = await unwrap(hookq.POST('/v1/groups/{group}/acks', { params: { path: { group: 'billing' } }, body: { deliveryIds: ids } }))
  t.same(
    acked.results.map((r) => r.status),
    ['acked', 'acked', 'acked'],
  )

  const status = await waitUntil(
    async () => {
      const s = await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'billing' } } }))
      return s.partitions.every((p) => p.lag === 0) ? s : undefined
    },
    15_000,
    'lag 0',
  )
  t.equal(
    status.partitions.reduce((n, p) => n + p.committedOffset, 0),
    3,
    'committed offsets past all three',
  )

  const log = await unwrap(hookq.GET('/v1/groups/{group}/deliveries', { params: { path: { group: 'billing' }, query: { limit: 10 } } }))
  t.equal(log.deliveries.filter((d) => d.outcome === 'acked').length, 3, 'the attempt log shows three acks')
})

t.test('errors come back as problem documents, or thrown with unwrap', async (t) => {
  const hookq = createClient({ baseUrl: url })

  const { data, error, response } = await hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'missing' } } })
  t.equal(data, undefined)
  t.equal(response.status, 404)
  t.equal(error?.code, 'topic_not_found')

  const thrown = await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'missing' } } })).catch((e: unknown) => e)
  t.ok(thrown instanceof HookqError)
  t.match(thrown, { status: 404, code: 'topic_not_found' })
})

t.test('the API key travels as a bearer token', async (t) => {
  const keyedBroker = await startListeningBroker(t, { HOOKQ_API_KEYS: 'sekret-key-0123456789:admin' })
  const anonymous = createClient({ baseUrl: keyedBroker.url, apiKey: '' })
  t.equal((await anonymous.GET('/v1/topics')).response.status, 401)
  const keyed = createClient({ baseUrl: keyedBroker.url, apiKey: 'sekret-key-0123456789' })
  t.equal((await keyed.GET('/v1/topics')).response.status, 200)
})

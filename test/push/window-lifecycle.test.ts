/**
 * Push windows over a consumer's life: a window whose consumer left (removed, or its group deleted)
 * while a push was under way goes when that push ends, so the per-consumer gauges do not keep a
 * series per departed consumer; and a handler that rejects messages (nacked, answered 500 by the
 * SDK's consumer helper) does not shrink the window of a fast consumer.
 */
import t from '../helpers/tap.ts'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { createClient, unwrap } from '@hookq/client'
import { createConsumer } from '@hookq/client/consumer'
import { api } from '../helpers/api.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const { broker, url } = await startListeningBroker(t, { HOOKQ_PUSH_WINDOW_INITIAL: '8' })
const { call, produce } = api(broker)
const metrics = async () => (await broker.app.inject({ method: 'GET', url: '/metrics' })).body

for (const how of ['consumer removed', 'group deleted'] as const) {
  t.test(`${how} mid-push: its window goes when the push ends`, async (t) => {
    const name = how === 'consumer removed' ? 'lk1' : 'lk2'
    const receiver = await startReceiver(t, { status: 200, delayMs: 3000 })
    t.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 1 })).status, 201)
    t.equal((await call('PUT', `/v1/groups/${name}`, { topic: name, ackMode: 'auto' })).status, 201)
    const id = (await call('POST', `/v1/groups/${name}/consumers`, { url: receiver.url })).json.id as string
    t.equal((await produce(name, [{ value: 1 }])).status, 201)
    await receiver.waitFor(1, 10_000)
    t.match(await metrics(), `hookq_pushes_in_flight{consumer="${id}"} 1`, 'the push is under way')
    const path = how === 'consumer removed' ? `/v1/groups/${name}/consumers/${id}` : `/v1/groups/${name}`
    t.equal((await call('DELETE', path)).status, 204)
    await waitUntil(() => receiver.requests[0]!.closed, 10_000, 'the push ended')
    await waitUntil(async () => !(await metrics()).includes(`consumer="${id}"`), 5000, `no series for ${id} any more`)
    t.pass('the window and its series are gone')
  })
}

const hookq = createClient({ baseUrl: url })

/** The push window gauge of consumer `id`, or undefined when it has no series. */
async function windowGauge(id: string): Promise<number | undefined> {
  const quoted = id.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  const m = new RegExp(`^hookq_push_window\\{consumer="${quoted}"\\} (\\d+)$`, 'm').exec(await metrics())
  return m ? Number(m[1]) : undefined
}

t.test('handler failures (nacked, answered 500) leave the window of a fast consumer alone', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'poison' } }, body: { partitions: 4 } }))
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'poison' } },
      body: { topic: 'poison', maxDeliveries: 50, retry: { initialDelayMs: 20, maxDelayMs: 50, multiplier: 1, jitter: 0 } },
    }),
  )
  let failures = 0
  const consumer = createConsumer({
    unsigned: true,
    baseUrl: url,
    nackDelayMs: 20,
    onError: () => {},
    handler: async (m) => {
      if ((m.value as { poison?: boolean }).poison) {
        failures++
        throw new Error('bad order')
      }
    },
  })
  const server = http.createServer(consumer.listener)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  )
  const { id } = await unwrap(
    hookq.POST('/v1/groups/{group}/consumers', {
      params: { path: { group: 'poison' } },
      body: { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` },
    }),
  )

  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'poison' } }, body: { messages: [{ value: { poison: true } }] } }),
  )
  await waitUntil(() => failures >= 4, 20_000, '4 failed attempts of one poison message')
  const w = await windowGauge(id)
  t.comment(`window after ${failures} handler failures of ONE message on a fast consumer: ${w}`)
  t.equal(w, 8, 'the window is unchanged by handler exceptions')
})

/**
 * A consumer's answer is quoted into the attempt log's error text, and it is the consumer's to
 * choose: one with NUL (which PostgreSQL text cannot hold) must still be recorded, and must not
 * stall the log for the attempts written with it.
 */
import t from 'tap'
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

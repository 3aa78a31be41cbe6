// An ack arriving exactly at the ack deadline races the redelivery: whichever wins, the message is
// completed once, every ack answers acked or already_completed (never both acked twice), and no
// attempt row is left in flight.
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, allCompleted } = api(broker)

t.test('acks at the deadline: one winner per message', async (t) => {
  await call('PUT', '/v1/topics/race', { partitions: 2 })
  await call('PUT', '/v1/groups/race-g', {
    topic: 'race',
    ackTimeoutMs: 1000,
    pushTimeoutMs: 500,
    retry: { initialDelayMs: 0, maxDelayMs: 0, jitter: 0 },
  })
  const statuses = new Map<number, string[]>() // offset*10+partition → statuses of every ack sent for it
  const acks: Promise<void>[] = []
  const receiver = await startReceiver(t, (req) => {
    const env = req.json as { deliveryId: string; partition: number; offset: number; ackDeadline: string }
    const key = env.offset * 10 + env.partition
    // Ack exactly when the deadline passes (and a little either side, across messages).
    const jitterMs = (key % 5) - 2
    const delayMs = Math.max(0, Date.parse(env.ackDeadline) - Date.now() + jitterMs)
    acks.push(
      new Promise((resolve) =>
        setTimeout(() => {
          call('POST', '/v1/groups/race-g/acks', { deliveryIds: [env.deliveryId] })
            .then((r) => {
              const list = statuses.get(key) ?? []
              list.push(r.json.results[0].status)
              statuses.set(key, list)
            })
            .finally(resolve)
        }, delayMs),
      ),
    )
    return { status: 200 }
  })
  await call('POST', '/v1/groups/race-g/consumers', { url: receiver.url })
  await produce(
    'race',
    Array.from({ length: 20 }, (_, i) => ({ value: i, partition: i % 2 })),
  )
  await allCompleted('race-g', 20_000)
  await waitUntil(
    async () => {
      await Promise.all(acks)
      return acks.length === receiver.requests.length
    },
    10_000,
    'every ack answered',
  )
  t.equal(statuses.size, 20, 'every message got acks')
  const raced = [...statuses.values()].filter((l) => l.length > 1).length
  t.comment(`${raced} of 20 messages were pushed again before their ack landed (the deadline won that race)`)
  for (const [key, list] of statuses) {
    t.equal(list.filter((s) => s === 'acked').length, 1, `message ${key}: exactly one ack won (${list.join(', ')})`)
    t.ok(
      list.every((s) => s === 'acked' || s === 'already_completed'),
      `message ${key}: the others found it completed`,
    )
  }
  await waitUntil(
    async () => (await sql(`SELECT count(*)::int AS n FROM deliveries WHERE outcome = 'in_flight'`))[0].n === 0,
    5000,
    'no attempt row left in flight',
  )
  const rows = await sql(`SELECT partition, committed_offset FROM group_offsets ORDER BY partition`)
  t.same(
    rows.map((r) => Number(r.committed_offset)),
    [10, 10],
  )
})

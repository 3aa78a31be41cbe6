/**
 * When a push goes out, against the real broker: produce → push latency when the dispatcher is
 * idle, and no lost wake-up when a group is created while produce calls land.
 */
import t from '../helpers/tap.ts'
import { setTimeout as sleep } from 'node:timers/promises'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, groupStatus } = api(broker)

interface TT {
  equal(found: unknown, wanted: unknown): boolean
  teardown(fn: () => unknown): void
}
async function topicAndGroup(tt: TT, name: string, group: object, partitions = 1) {
  tt.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  tt.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name, ...group })).status, 201)
}
const addConsumer = async (group: string, url: string, secret?: string) => {
  const res = await call('POST', `/v1/groups/${group}/consumers`, { url, ...(secret ? { secret } : {}) })
  if (res.status !== 201) throw new Error(`add consumer: ${res.status} ${JSON.stringify(res.json)}`)
  return res.json.id as string
}

t.test('latency: a message produced while the dispatcher is idle is pushed promptly', async (t) => {
  await topicAndGroup(t, 'lat', { ackMode: 'auto' }, 3)
  const arrived: number[] = []
  const r = await startReceiver(t, () => {
    arrived.push(Date.now())
    return { status: 200 }
  })
  await addConsumer('lat-g', r.url)
  const lat: number[] = []
  for (let i = 0; i < 4; i++) {
    // Not a wait for a condition: the dispatcher is left idle on purpose (nothing in flight, nothing
    // scheduled) for a while before each produce, since what is measured is a wake-up from idle.
    await sleep(i === 0 ? 1500 : 400)
    const before = Date.now()
    await produce('lat', [{ value: i, partition: i % 3 }])
    await r.waitFor(i + 1, 3000)
    lat.push(arrived[i]! - before)
  }
  t.comment(`produce → push: ${lat.join(', ')} ms`)
  t.ok(
    lat.every((ms) => ms < 1000),
    'each within 1 s of the produce call',
  )
})

t.test('a group created while produce calls are landing loses no wake-up: every message is pushed', async (t) => {
  // 16 partitions make the group's start-up (one attempt-count query per partition) take a while.
  // One produce call per trial fires at a different moment while the group is being created (the
  // delays sweep the whole duration of the PUT, measured first). No later produce comes to wake a
  // partition whose notification was missed, so a lost wake-up shows as lag that never drains.
  const r = await startReceiver(t)
  const groups: string[] = []
  const trial = async (k: number, delayMs: number) => {
    const name = `race${k}`
    t.equal((await call('PUT', `/v1/topics/${name}`, { partitions: 16 })).status, 201)
    const started = performance.now()
    const creating = call('PUT', `/v1/groups/${name}-g`, { topic: name, ackMode: 'auto' }).then((res) => ({
      res,
      ms: performance.now() - started,
    }))
    // Not a wait for a condition: the produce call is fired this far into the group's creation.
    await sleep(delayMs)
    const producing = produce(
      name,
      Array.from({ length: 16 }, (_, p) => ({ value: `${k}-${p}`, partition: p })),
    )
    const [c, p] = await Promise.all([creating, producing])
    t.equal(c.res.status, 201)
    t.equal(p.status, 201)
    await addConsumer(`${name}-g`, r.url)
    groups.push(`${name}-g`)
    return c.ms
  }
  // Warm-up trials (they count too) measure how long creating a group takes.
  let putMs = 0
  for (let k = 0; k < 3; k++) putMs = await trial(k, 0)
  // 16 points over the PUT's duration (30 took this file past tap's 180 s on a loaded machine).
  const sweep = 16
  for (let i = 0; i < sweep; i++) await trial(3 + i, Math.round((i * putMs * 1.2) / sweep))
  const total = groups.length * 16
  await waitUntil(() => r.requests.length >= total, 5000, 'every message pushed').catch(() => {})
  const stuck: string[] = []
  for (const group of groups) {
    const s = await groupStatus(group)
    const lagging = s.partitions.filter((x: { lag: number }) => x.lag > 0).map((x: { partition: number }) => x.partition)
    if (lagging.length > 0) stuck.push(`${group}: ${lagging.length} partitions`)
  }
  t.comment(`group creation took ~${Math.round(putMs)} ms; produce delays swept 0..${Math.round(putMs * 1.2)} ms`)
  t.same(stuck, [], `groups with messages never pushed: ${stuck.join('; ')}`)
  t.equal(r.requests.length, total, `${r.requests.length} of ${total} messages pushed`)
})

import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const call = async (method: string, url: string, payload?: unknown) => {
  const res = await broker.app.inject({ method: method as 'GET', url, ...(payload === undefined ? {} : { payload: payload as object }) })
  return { status: res.statusCode, json: res.body ? res.json() : undefined }
}
const seek = (group: string, body: unknown) => call('POST', `/v1/groups/${group}/seek`, body)
const committed = async (group: string) =>
  (await call('GET', `/v1/groups/${group}`)).json.partitions.map((p: { committedOffset: number }) => p.committedOffset)
const offsetsOf = (res: { json: { partitions: { partition: number; committedOffset: number }[] } }) => {
  res.json.partitions.forEach((p, i) => {
    if (p.partition !== i) throw new Error('partitions out of order')
  })
  return res.json.partitions.map((p) => p.committedOffset)
}

// Three partitions of four messages each; offsets 0 and 1 of each are an hour old. No consumer:
// committed offsets move only by seek here.
await call('PUT', '/v1/topics/ledger', { partitions: 3 })
for (const batch of [0, 1]) {
  await call('POST', '/v1/topics/ledger/messages', {
    messages: [0, 1, 2].flatMap((p) => [0, 1].map((i) => ({ value: `${p}-${batch * 2 + i}`, partition: p }))),
  })
  if (batch === 0) await broker.db.pool.query(`UPDATE messages SET produced_at = produced_at - interval '1 hour'`)
}
await call('PUT', '/v1/groups/reader', { topic: 'ledger' })

t.test('by offset: one partition, then all of them; the end offset is allowed, past it is not', async (t) => {
  const one = await seek('reader', { partition: 1, offset: 2 })
  t.equal(one.status, 200)
  t.same(offsetsOf(one), [0, 2, 0], 'only partition 1 moved; the answer lists every partition')
  t.same(await committed('reader'), [0, 2, 0], 'the group status agrees')
  t.same(offsetsOf(await seek('reader', { offset: 3 })), [3, 3, 3])
  t.same(offsetsOf(await seek('reader', { partition: 2, offset: 0 })), [3, 3, 0], 'backwards too')
  t.same(offsetsOf(await seek('reader', { offset: 4 })), [4, 4, 4], 'the end offset: nothing left to push')

  const past = await seek('reader', { partition: 0, offset: 5 })
  t.equal(past.status, 400)
  t.equal(past.json.code, 'offset_out_of_range')
  t.match(past.json.detail, /partition 0 \(end offset 4\)/)
  await call('POST', '/v1/topics/ledger/messages', { messages: [{ value: '0-4', partition: 0 }] })
  t.same(offsetsOf(await seek('reader', { partition: 0, offset: 5 })), [5, 4, 4], 'fine once the partition has grown')
  const pastSome = await seek('reader', { offset: 5 })
  t.equal(pastSome.json.code, 'offset_out_of_range', 'with no partition named, too far for any partition refuses the seek')
  t.match(pastSome.json.detail, /partition 1 .*partition 2/)
  t.same(await committed('reader'), [5, 4, 4], 'a refused seek moves nothing')
})

t.test('by timestamp: the first offset produced at or after it, else the end', async (t) => {
  const recent = new Date(Date.now() - 60_000).toISOString()
  t.same(offsetsOf(await seek('reader', { timestamp: recent })), [2, 2, 2], 'past the hour-old messages')
  t.same(offsetsOf(await seek('reader', { timestamp: '2000-01-01T00:00:00Z' })), [0, 0, 0], 'long ago: the first offsets')
  t.same(offsetsOf(await seek('reader', { partition: 1, timestamp: recent })), [0, 2, 0], 'one partition')
  t.same(
    offsetsOf(await seek('reader', { timestamp: new Date(Date.now() + 3_600_000).toISOString() })),
    [5, 4, 4],
    'the future: the end offsets',
  )
})

t.test('bad seeks', async (t) => {
  const bad: [string, unknown, number, string][] = [
    ['reader', { offset: 1, timestamp: new Date().toISOString() }, 400, 'invalid_request'],
    ['reader', {}, 400, 'invalid_request'],
    ['reader', { partition: 0 }, 400, 'invalid_request'],
    ['reader', { offset: -1 }, 400, 'invalid_request'],
    ['reader', { offset: '1' }, 400, 'invalid_request'],
    ['reader', { timestamp: 'yesterday' }, 400, 'invalid_request'],
    ['reader', { offset: 0, extra: true }, 400, 'invalid_request'],
    ['reader', { partition: 3, offset: 0 }, 404, 'partition_not_found'],
    ['nope', { offset: 0 }, 404, 'group_not_found'],
  ]
  const before = await committed('reader')
  for (const [group, body, status, code] of bad) {
    const res = await seek(group, body)
    t.equal(res.status, status, JSON.stringify(body))
    t.equal(res.json.code, code, JSON.stringify(body))
  }
  t.same(await committed('reader'), before, 'nothing moved')

  await call('PUT', '/v1/topics/brief', { partitions: 1 })
  await call('PUT', '/v1/groups/orphan', { topic: 'brief' })
  await call('DELETE', '/v1/topics/brief')
  const orphan = await seek('orphan', { offset: 0 })
  t.equal(orphan.status, 404)
  t.equal(orphan.json.code, 'topic_not_found', "the group's topic is gone")
})

t.test('seeking back pushes acked messages again; ids from before the seek no longer count', async (t) => {
  await call('PUT', '/v1/topics/replay', { partitions: 1 })
  await call('PUT', '/v1/groups/replayer', { topic: 'replay' })
  const receiver = await startReceiver(t)
  await call('POST', '/v1/groups/replayer/consumers', { url: receiver.url })
  await call('POST', '/v1/topics/replay/messages', { messages: [{ value: 'a' }, { value: 'b' }, { value: 'c' }] })
  const first = (await receiver.waitFor(3)).map((r) => r.json as { deliveryId: string; offset: number })
  const acks = await call('POST', '/v1/groups/replayer/acks', { deliveryIds: first.map((e) => e.deliveryId) })
  t.same(
    acks.json.results.map((r: { status: string }) => r.status),
    ['acked', 'acked', 'acked'],
  )
  t.same(await committed('replayer'), [3])

  t.same(offsetsOf(await seek('replayer', { offset: 1 })), [1])
  const again = (await receiver.waitFor(5))
    .slice(3)
    .map((r) => r.json as { deliveryId: string; offset: number; value: string; attempt: number })
  t.same(
    again.map((e) => [e.offset, e.value, e.attempt]).sort(),
    [
      [1, 'b', 1],
      [2, 'c', 1],
    ],
    'offsets 1 and 2 again, counted afresh',
  )
  t.notOk(
    again.some((e) => first.some((f) => f.deliveryId === e.deliveryId)),
    'new delivery ids',
  )
  const stale = await call('POST', '/v1/groups/replayer/acks', { deliveryIds: [first[1]!.deliveryId] })
  t.equal(stale.json.results[0].status, 'unknown', 'an id from before the seek')
  t.match((await call('GET', '/v1/groups/replayer')).json.partitions[0], { committedOffset: 1, inFlight: 2 })

  await call('POST', '/v1/groups/replayer/acks', { deliveryIds: again.map((e) => e.deliveryId) })
  t.same(await committed('replayer'), [3])
  await new Promise((r) => setTimeout(r, 300))
  t.equal(receiver.requests.length, 5, 'offset 0 was not pushed again')

  // Seeking forward skips what is in flight: nothing more is pushed, the lag is gone.
  await call('POST', '/v1/topics/replay/messages', { messages: [{ value: 'd' }, { value: 'e' }] })
  await receiver.waitFor(7)
  t.same(offsetsOf(await seek('replayer', { offset: 5 })), [5])
  await waitUntil(async () => (await call('GET', '/v1/groups/replayer')).json.partitions[0].inFlight === 0, 5000, 'nothing in flight')
  t.match((await call('GET', '/v1/groups/replayer')).json.partitions[0], { committedOffset: 5, lag: 0 })
})

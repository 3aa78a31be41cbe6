/**
 * Group filters (contract v1.1 "Filters") against a real broker and receiver: only matching
 * messages are pushed; the others are completed without an attempt (no attempt row), counted per
 * partition in the group status and in /metrics; a filter that is not well formed is a 400 naming
 * the member and changes nothing; a changed filter applies to messages not pushed yet.
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus, allCompleted } = api(broker)

const pushedValues = (requests: { json: unknown }[]) => requests.map((r) => (r.json as { value: unknown }).value)
const filteredTotal = async (group: string) =>
  (await groupStatus(group)).partitions.reduce((n: number, p: { filtered: number }) => n + p.filtered, 0)
const attemptRows = async (group: string) => {
  // Finished attempts wait up to 20 ms for company before they are written; the listing writes
  // this broker's first (OperationsService.deliveries), so the table is complete after it.
  await call('GET', `/v1/groups/${group}/deliveries?limit=1`)
  return Number(
    (await sql('SELECT count(*) AS n FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = $1', [group]))[0].n,
  )
}

t.test('a bad filter is refused naming the member, and changes nothing', async (t) => {
  t.equal((await call('PUT', '/v1/topics/fb', { partitions: 1 })).status, 201)
  for (const [filter, member] of [
    [{ 'value.total': { gt: 'ten' } }, 'filter.value.total.gt'],
    [{ colour: 'red' }, 'filter.colour'],
    [{ $or: [{ key: 'a' }, { 'headers.x': { nope: 1 } }] }, 'filter.$or[1].headers.x'],
    [[1, 2], 'filter'],
  ] as const) {
    const res = await call('PUT', '/v1/groups/fb-g', { topic: 'fb', filter })
    t.equal(res.status, 400, JSON.stringify(filter))
    t.equal(res.json.code, 'invalid_request')
    t.ok(String(res.json.detail).includes(member), `names ${member}: ${res.json.detail}`)
  }
  t.equal((await call('GET', '/v1/groups/fb-g')).status, 404, 'no group was created')
  t.equal((await call('PUT', '/v1/groups/fb-g', { topic: 'fb', filter: { key: 'a' } })).status, 201)
  t.equal((await call('PUT', '/v1/groups/fb-g', { topic: 'fb', filter: { key: { prefix: 1 } } })).status, 400)
  t.same((await call('GET', '/v1/groups/fb-g')).json.filter, { key: 'a' }, 'a refused update kept the filter')
  t.same(
    (await call('PUT', '/v1/groups/fb-g', { topic: 'fb', maxInFlight: 5 })).json.filter,
    { key: 'a' },
    'an update that does not name it keeps it',
  )
  t.equal((await call('PUT', '/v1/groups/fb-g', { topic: 'fb', filter: null })).json.filter, null, 'null removes it')
})

t.test('only matching messages are pushed; the rest complete without an attempt, counted', async (t) => {
  t.equal((await call('PUT', '/v1/topics/orders', { partitions: 3 })).status, 201)
  const filter = {
    'headers.type': ['created', 'paid'],
    $or: [{ 'value.region': { prefix: 'eu-' } }, { 'value.total': { gte: 100 } }],
    'value.test': { exists: false },
    key: { not: ['k0'] },
  }
  const created = await call('PUT', '/v1/groups/orders-g', { topic: 'orders', ackMode: 'auto', filter })
  t.equal(created.status, 201)
  t.same(created.json.filter, filter, 'the filter as given')
  const receiver = await startReceiver(t)
  t.equal((await call('POST', '/v1/groups/orders-g/consumers', { url: receiver.url })).status, 201)

  const messages = Array.from({ length: 300 }, (_, i) => {
    const region = ['eu-west', 'us-east', 'ap-south'][i % 3]!
    const type = ['created', 'paid', 'refunded', 'created'][i % 4]!
    return { key: `k${i % 7}`, value: { i, region, total: i % 150, ...(i % 50 === 0 ? { test: true } : {}) }, headers: { type } }
  })
  const expected = messages
    .filter(
      (m) =>
        (m.headers.type === 'created' || m.headers.type === 'paid') &&
        (m.value.region.startsWith('eu-') || m.value.total >= 100) &&
        m.value.test === undefined &&
        m.key !== 'k0',
    )
    .map((m) => m.value)
  t.ok(expected.length > 50 && expected.length < 200, `${expected.length} of 300 match`)
  t.equal((await produce('orders', messages)).status, 201)

  await allCompleted('orders-g', 30_000)
  const pushed = pushedValues(receiver.requests) as { i: number }[]
  t.same(
    pushed.map((v) => v.i).sort((a, b) => a - b),
    expected.map((v) => v.i),
    'exactly the matching messages were pushed, once each',
  )
  t.equal(await filteredTotal('orders-g'), 300 - expected.length, 'the others are counted as filtered')
  t.equal(await attemptRows('orders-g'), expected.length, 'an attempt row per push, none for a filtered message')
  const metrics = (await broker.app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(metrics, new RegExp(`hookq_filtered_total\\{group="orders-g"\\} ${300 - expected.length}\\b`))
})

t.test('a filter that matches nothing still moves the committed offset', async (t) => {
  t.equal((await call('PUT', '/v1/topics/none', { partitions: 2 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/none-g', { topic: 'none', filter: { 'value.never': { exists: true } } })).status, 201)
  const receiver = await startReceiver(t)
  t.equal((await call('POST', '/v1/groups/none-g/consumers', { url: receiver.url })).status, 201)
  t.equal(
    (
      await produce(
        'none',
        Array.from({ length: 1000 }, (_, i) => ({ value: { i } })),
      )
    ).status,
    201,
  )
  await allCompleted('none-g', 30_000)
  const status = await groupStatus('none-g')
  t.same(
    status.partitions.map((p: { committedOffset: number; endOffset: number }) => p.committedOffset),
    status.partitions.map((p: { endOffset: number }) => p.endOffset),
  )
  t.equal(await filteredTotal('none-g'), 1000)
  t.equal(receiver.requests.length, 0)
  // group_completions keeps nothing for the filtered once the committed offset passed them.
  t.equal(
    Number(
      (
        await sql('SELECT count(*) AS n FROM group_completions c JOIN consumer_groups g ON g.id = c.group_id WHERE g.name = $1', ['none-g'])
      )[0].n,
    ),
    0,
  )
})

t.test('a changed filter applies to messages not pushed yet, delayed ones too', async (t) => {
  t.equal((await call('PUT', '/v1/topics/chg', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/chg-g', { topic: 'chg', ackMode: 'auto', filter: { 'headers.kind': 'a' } })).status, 201)
  const receiver = await startReceiver(t)
  t.equal((await call('POST', '/v1/groups/chg-g/consumers', { url: receiver.url })).status, 201)

  // Pushed under the first filter: only kind a.
  t.equal(
    (
      await produce('chg', [
        { value: 'a1', headers: { kind: 'a' } },
        { value: 'b1', headers: { kind: 'b' } },
      ])
    ).status,
    201,
  )
  await allCompleted('chg-g')
  t.same(pushedValues(receiver.requests), ['a1'])

  // Delayed messages are admitted now and checked when their delay ends: after the change.
  t.equal(
    (
      await produce('chg', [
        { value: 'a2', headers: { kind: 'a' }, delayMs: 1500 },
        { value: 'b2', headers: { kind: 'b' }, delayMs: 1500 },
      ])
    ).status,
    201,
  )
  await waitUntil(async () => (await groupStatus('chg-g')).partitions[0].inFlight === 2, 10_000, 'the delayed messages are admitted')
  t.equal((await call('PUT', '/v1/groups/chg-g', { topic: 'chg', filter: { 'headers.kind': 'b' } })).status, 200)
  // And messages produced while paused wait in the log, then meet the new filter too.
  t.equal((await call('PUT', '/v1/groups/chg-g', { topic: 'chg', paused: true })).status, 200)
  t.equal(
    (
      await produce('chg', [
        { value: 'a3', headers: { kind: 'a' } },
        { value: 'b3', headers: { kind: 'b' } },
      ])
    ).status,
    201,
  )
  t.equal((await call('PUT', '/v1/groups/chg-g', { topic: 'chg', paused: false })).status, 200)
  await allCompleted('chg-g', 15_000)
  t.same(pushedValues(receiver.requests).sort(), ['a1', 'b2', 'b3'], 'after the change only kind b')
  t.equal(await filteredTotal('chg-g'), 3, 'b1, a2 and a3 were filtered')
})

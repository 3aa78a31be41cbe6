import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'

const broker = await startBroker(t)
const app = broker.app

async function put(name: string, body: unknown) {
  return app.inject({ method: 'PUT', url: `/v1/topics/${name}`, payload: body as object })
}

t.test('create is idempotent for the same config and 409 for another partition count', async (t) => {
  const created = await put('orders', { partitions: 4 })
  t.equal(created.statusCode, 201)
  const topic = created.json()
  t.match(topic, { name: 'orders', partitions: 4, retentionMs: 604800000 })
  t.ok(!Number.isNaN(Date.parse(topic.createdAt)), 'createdAt is an ISO timestamp')

  const again = await put('orders', { partitions: 4 })
  t.equal(again.statusCode, 200)
  t.same(again.json(), topic, 'same topic back, unchanged')

  const conflict = await put('orders', { partitions: 8 })
  t.equal(conflict.statusCode, 409)
  t.match(conflict.headers['content-type'], /^application\/problem\+json/)
  t.match(conflict.json(), { status: 409, code: 'topic_conflict', title: String, type: String, detail: /4 partitions/ })

  const described = (await app.inject({ url: '/v1/topics/orders' })).json()
  t.equal(described.partitions, 4, 'the conflicting PUT changed nothing')
})

t.test('retention can change; partitions cannot', async (t) => {
  t.equal((await put('retained', { partitions: 1, retentionMs: 3_600_000 })).statusCode, 201)
  const updated = await put('retained', { partitions: 1, retentionMs: 7_200_000 })
  t.equal(updated.statusCode, 200)
  t.equal(updated.json().retentionMs, 7_200_000)
})

t.test('list and describe', async (t) => {
  await put('b-topic', { partitions: 2 })
  await put('a-topic', { partitions: 1 })
  const list = (await app.inject({ url: '/v1/topics' })).json()
  const names = list.topics.map((x: { name: string }) => x.name)
  t.ok(names.indexOf('a-topic') < names.indexOf('b-topic'), 'sorted by name')
  t.match(
    list.topics.find((x: { name: string }) => x.name === 'b-topic'),
    { partitions: 2, retentionMs: Number, createdAt: String },
  )

  await app.inject({
    method: 'POST',
    url: '/v1/topics/b-topic/messages',
    payload: {
      messages: [
        { value: 1, partition: 1 },
        { value: 2, partition: 1 },
      ],
    },
  })
  const detail = (await app.inject({ url: '/v1/topics/b-topic' })).json()
  t.same(detail.partitionStats, [
    { partition: 0, startOffset: 0, endOffset: 0 },
    { partition: 1, startOffset: 0, endOffset: 2 },
  ])
  t.equal(detail.storage.messages, 2, 'messages kept')
  t.ok(Date.parse(detail.storage.oldestMessageAt) <= Date.now(), 'the oldest kept has a produce time')
  t.ok(detail.storage.approxBytes > 0, 'a share of the table')
  t.same((await app.inject({ url: '/v1/topics/a-topic' })).json().storage, { messages: 0, oldestMessageAt: null, approxBytes: 0 })
})

t.test('delete removes the topic, and the next sweep its messages', async (t) => {
  await put('doomed', { partitions: 1 })
  await app.inject({ method: 'POST', url: '/v1/topics/doomed/messages', payload: { messages: [{ value: 'x' }] } })
  const del = await app.inject({ method: 'DELETE', url: '/v1/topics/doomed' })
  t.equal(del.statusCode, 204)
  t.equal(del.body, '')
  t.equal((await app.inject({ url: '/v1/topics/doomed' })).statusCode, 404)
  const produce = await app.inject({ method: 'POST', url: '/v1/topics/doomed/messages', payload: { messages: [{ value: 'x' }] } })
  t.equal(produce.statusCode, 404, 'produce to a deleted topic is 404, even with its row cached')
  t.equal(produce.json().code, 'topic_not_found')
  // Not row by row in the delete's transaction: the retention sweep drops the topic's chunks whole.
  await broker.retention.sweep()
  const { rows } = await broker.db.pool.query(
    `SELECT count(*)::int AS n FROM messages m LEFT JOIN topics t ON t.id = m.topic_id WHERE t.id IS NULL`,
  )
  t.equal(rows[0].n, 0, 'no orphaned messages after the sweep')
  t.equal((await app.inject({ method: 'DELETE', url: '/v1/topics/doomed' })).statusCode, 404)

  // Recreate with another partition count: a new topic, starting at offset 0.
  t.equal((await put('doomed', { partitions: 2 })).statusCode, 201)
  const p = await app.inject({ method: 'POST', url: '/v1/topics/doomed/messages', payload: { messages: [{ value: 'y', partition: 1 }] } })
  t.same(p.json().results, [{ partition: 1, offset: 0 }])
})

t.test('bad input is a problem document and changes nothing', async (t) => {
  const cases: [string, unknown, string][] = [
    ['bad name!', { partitions: 1 }, 'invalid name'],
    ['x'.repeat(250), { partitions: 1 }, 'name too long'],
    ['ok-name', { partitions: 0 }, 'zero partitions'],
    ['ok-name', { partitions: 2000 }, 'too many partitions'],
    ['ok-name', { partitions: '4' }, 'partitions as a string'],
    ['ok-name', { partitions: 1.5 }, 'fractional partitions'],
    ['ok-name', { partitions: 1, extra: true }, 'unknown field'],
    ['ok-name', {}, 'missing partitions'],
    ['ok-name', [], 'array body'],
    ['ok-name', { partitions: 1, retentionMs: -5 }, 'negative retention'],
  ]
  for (const [name, body, what] of cases) {
    const res = await app.inject({
      method: 'PUT',
      url: `/v1/topics/${encodeURIComponent(name)}`,
      payload: JSON.stringify(body),
      headers: { 'content-type': 'application/json' },
    })
    t.equal(res.statusCode, 400, what)
    t.match(res.headers['content-type'], /^application\/problem\+json/, `${what}: content type`)
    t.match(res.json(), { status: 400, code: 'invalid_request', detail: String }, what)
  }
  const syntax = await app.inject({
    method: 'PUT',
    url: '/v1/topics/ok-name',
    payload: '{"partitions":',
    headers: { 'content-type': 'application/json' },
  })
  t.equal(syntax.statusCode, 400)
  t.equal(syntax.json().code, 'invalid_json')
  const media = await app.inject({
    method: 'PUT',
    url: '/v1/topics/ok-name',
    payload: 'partitions=1',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
  })
  t.equal(media.statusCode, 415)
  t.equal(media.json().code, 'unsupported_media_type')
  t.equal((await app.inject({ url: '/v1/topics/ok-name' })).statusCode, 404, 'nothing was created')
  const unknown = await app.inject({ url: '/v1/nothing-here' })
  t.equal(unknown.statusCode, 404)
  t.equal(unknown.json().code, 'route_not_found')
})

t.test('concurrent creators of one topic: one 201, the rest 200', async (t) => {
  const answers = await Promise.all(Array.from({ length: 8 }, () => put('raced', { partitions: 3 })))
  const codes = answers.map((a) => a.statusCode).sort()
  t.same(codes, [200, 200, 200, 200, 200, 200, 200, 201])
  const { rows } = await broker.db.pool.query(
    `SELECT count(*)::int AS n FROM topic_partitions p JOIN topics t ON t.id = p.topic_id WHERE t.name = 'raced'`,
  )
  t.equal(rows[0].n, 3)
})

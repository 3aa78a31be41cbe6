import t from '../helpers/tap.ts'
import { partitionForKey } from '../../src/core/partitioner.ts'
import { startBroker } from '../helpers/broker.ts'

const broker = await startBroker(t, { HOOKQ_MAX_MESSAGE_BYTES: '4096', HOOKQ_MAX_REQUEST_BYTES: '65536' })
const app = broker.app

async function createTopic(name: string, partitions: number) {
  const res = await app.inject({ method: 'PUT', url: `/v1/topics/${name}`, payload: { partitions } })
  if (res.statusCode !== 201) throw new Error(`create ${name}: ${res.body}`)
}
function produce(topic: string, messages: unknown[]) {
  return app.inject({ method: 'POST', url: `/v1/topics/${topic}/messages`, payload: { messages } })
}
async function fetchAll(topic: string, partition: number, fromOffset = 0, limit = 1000) {
  const res = await app.inject({ url: `/v1/topics/${topic}/partitions/${partition}/messages?fromOffset=${fromOffset}&limit=${limit}` })
  if (res.statusCode !== 200) throw new Error(res.body)
  return res.json() as {
    messages: {
      partition: number
      offset: number
      key: string | null
      value: unknown
      headers: Record<string, string>
      timestamp: string
    }[]
    nextOffset: number
  }
}

t.test('values, keys and headers round-trip deep-equal', async (t) => {
  await createTopic('round', 1)
  const values: unknown[] = [
    { nested: { deep: [1, 2, { x: null }], emoji: '🦊', accents: 'ça marche', cjk: '日本語' } },
    'nul \u0000 inside and \u0001 control',
    { '\u0000key': '\u0000' },
    42,
    -0.5,
    1e300,
    true,
    false,
    null,
    [],
    {},
    '',
    'a'.repeat(1000),
  ]
  const res = await produce(
    'round',
    values.map((value, i) => (i % 2 ? { value, key: `k${i}`, headers: { 'x-i': String(i), 'x-nul': 'a\u0000b' } } : { value })),
  )
  t.equal(res.statusCode, 201)
  t.same(
    res.json().results,
    values.map((_, offset) => ({ partition: 0, offset })),
  )
  const { messages, nextOffset } = await fetchAll('round', 0)
  t.equal(nextOffset, values.length)
  for (const [i, m] of messages.entries()) {
    t.strictSame(m.value, values[i], `value ${i}`)
    if (i % 2) {
      t.equal(m.key, `k${i}`)
      t.strictSame(m.headers, { 'x-i': String(i), 'x-nul': 'a\u0000b' })
    } else {
      t.equal(m.key, null, 'no key → null')
      t.strictSame(m.headers, {}, 'no headers → {}')
    }
    t.equal(m.offset, i)
    t.ok(Date.now() - Date.parse(m.timestamp) < 60_000, 'timestamp is the produce time')
  }
  const timestamps = messages.map((m) => Date.parse(m.timestamp))
  t.same(
    timestamps,
    [...timestamps].sort((a, b) => a - b),
    'timestamps never go backwards along offsets',
  )
})

t.test('partition choice: explicit, by key hash, or spread evenly', async (t) => {
  await createTopic('parts', 4)
  const explicit = await produce('parts', [{ value: 1, partition: 3, key: 'ignored-for-placement' }])
  t.same(explicit.json().results, [{ partition: 3, offset: 0 }])

  const keyed = await produce(
    'parts',
    Array.from({ length: 20 }, (_, i) => ({ value: i, key: `user-${i % 5}` })),
  )
  for (const [i, r] of keyed.json().results.entries()) {
    t.equal(r.partition, partitionForKey(`user-${i % 5}`, 4), `key user-${i % 5} → its hash partition`)
  }

  const spread = await produce(
    'parts',
    Array.from({ length: 400 }, (_, i) => ({ value: i })),
  )
  const perPartition = [0, 0, 0, 0]
  for (const r of spread.json().results) perPartition[r.partition]!++
  t.same(perPartition, [100, 100, 100, 100], 'unkeyed messages are spread evenly')

  const bad = await produce('parts', [{ value: 1 }, { value: 2, partition: 4 }])
  t.equal(bad.statusCode, 400)
  t.match(bad.json(), { code: 'invalid_request', index: 1, detail: /partition 4/ })
})

t.test('offsets are dense per partition and fetch pages through them', async (t) => {
  await createTopic('dense', 2)
  for (let i = 0; i < 5; i++)
    await produce(
      'dense',
      Array.from({ length: 30 }, (_, j) => ({ value: i * 30 + j, partition: j % 2 })),
    )
  for (const partition of [0, 1]) {
    const seen: number[] = []
    let from = 0
    for (;;) {
      const page = await fetchAll('dense', partition, from, 7)
      if (page.messages.length === 0) {
        t.equal(page.nextOffset, from, 'empty page keeps the offset')
        break
      }
      seen.push(...page.messages.map((m) => m.offset))
      from = page.nextOffset
    }
    t.same(
      seen,
      Array.from({ length: 75 }, (_, i) => i),
      `partition ${partition} offsets 0..74`,
    )
  }
  const res = await app.inject({ url: '/v1/topics/dense/partitions/2/messages' })
  t.equal(res.statusCode, 404)
  t.equal(res.json().code, 'partition_not_found')
  t.equal((await app.inject({ url: '/v1/topics/nope/partitions/0/messages' })).json().code, 'topic_not_found')
  t.equal((await app.inject({ url: '/v1/topics/dense/partitions/0/messages?limit=0' })).statusCode, 400)
  t.equal((await app.inject({ url: '/v1/topics/dense/partitions/0/messages?limit=1001' })).statusCode, 400)
  t.equal((await app.inject({ url: '/v1/topics/dense/partitions/0/messages?fromOffset=-1' })).statusCode, 400)
  t.equal((await app.inject({ url: '/v1/topics/dense/partitions/x/messages' })).statusCode, 400)
})

t.test('idempotency keys: a repeat returns the original coordinates and stores nothing', async (t) => {
  await createTopic('idem', 3)
  const first = await produce('idem', [
    { value: 'a', idempotencyKey: 'order-1' },
    { value: 'b', idempotencyKey: 'order-2' },
  ])
  const [a, b] = first.json().results
  t.notOk(a.duplicate)
  const again = await produce('idem', [
    { value: 'changed', idempotencyKey: 'order-1' },
    { value: 'c', idempotencyKey: 'order-3' },
  ])
  t.equal(again.statusCode, 201)
  t.same(again.json().results[0], { partition: a.partition, offset: a.offset, duplicate: true })
  t.notOk(again.json().results[1].duplicate)

  const inBatch = await produce('idem', [
    { value: 'x', idempotencyKey: 'k-batch' },
    { value: 'y', idempotencyKey: 'k-batch' },
    { value: 'z', idempotencyKey: 'order-2' },
  ])
  const [x, y, z] = inBatch.json().results
  t.notOk(x.duplicate)
  t.same(y, { partition: x.partition, offset: x.offset, duplicate: true }, 'a repeat within one call points at the first')
  t.same(z, { partition: b.partition, offset: b.offset, duplicate: true })

  // Concurrent calls with one key: exactly one stores it.
  const racers = await Promise.all(Array.from({ length: 20 }, (_, i) => produce('idem', [{ value: i, idempotencyKey: 'raced' }])))
  const results = racers.map((r) => r.json().results[0])
  t.equal(results.filter((r) => !r.duplicate).length, 1, 'one original')
  t.equal(new Set(results.map((r) => `${r.partition}:${r.offset}`)).size, 1, 'all point at it')

  // One message stored per key, and each key points at its message.
  const { rows } = await broker.db.pool.query(
    `SELECT count(*)::int AS n FROM messages m JOIN topics t ON t.id = m.topic_id WHERE t.name = 'idem'`,
  )
  t.equal(rows[0].n, 5, 'order-1, order-2, order-3, k-batch and raced: one message each')
  const keyed = await broker.db.pool.query(
    `SELECT i.key, m.value FROM idempotency_keys i JOIN topics t ON t.id = i.topic_id
     JOIN messages m ON m.topic_id = i.topic_id AND m.partition = i.partition AND m."offset" = i."offset" WHERE t.name = 'idem'`,
  )
  const values = Object.fromEntries(keyed.rows.map((r) => [r.key, JSON.parse(r.value)]))
  t.same(Object.keys(values).sort(), ['k-batch', 'order-1', 'order-2', 'order-3', 'raced'])
  t.same([values['order-1'], values['order-2'], values['order-3'], values['k-batch']], ['a', 'b', 'c', 'x'])
  const stored = await fetchAll('idem', a.partition)
  t.equal(stored.messages.find((m) => m.offset === a.offset)?.value, 'a', 'the original value is kept')

  // Keys are per topic.
  await createTopic('idem-other', 1)
  const other = await produce('idem-other', [{ value: 'a', idempotencyKey: 'order-1' }])
  t.notOk(other.json().results[0].duplicate)
})

t.test('an idempotency key outlives its message only within retention', async (t) => {
  await app.inject({ method: 'PUT', url: '/v1/topics/short', payload: { partitions: 1, retentionMs: 60_000 } })
  const first = (await produce('short', [{ value: 1, idempotencyKey: 'once' }])).json().results[0]
  // Age the key past the retention directly in the database.
  await broker.db.pool.query(`UPDATE idempotency_keys SET produced_at = produced_at - interval '2 minutes' WHERE key = 'once'`)
  const later = (await produce('short', [{ value: 2, idempotencyKey: 'once' }])).json().results[0]
  t.notOk(later.duplicate, 'expired key no longer deduplicates')
  t.equal(later.offset, first.offset + 1)
})

t.test('delayMs sets the time a message becomes available', async (t) => {
  await createTopic('delayed', 1)
  await produce('delayed', [{ value: 'now' }, { value: 'later', delayMs: 90_000 }])
  const { rows } = await broker.db.pool.query(
    `SELECT "offset", extract(epoch from (available_at - produced_at)) * 1000 AS delay_ms FROM messages m JOIN topics t ON t.id = m.topic_id WHERE t.name = 'delayed' ORDER BY "offset"`,
  )
  t.same(
    rows.map((r) => Number(r.delay_ms)),
    [0, 90_000],
  )
})

t.test('limits: message count, message size, body size', async (t) => {
  await createTopic('limits', 1)
  const many = await produce(
    'limits',
    Array.from({ length: 1001 }, () => ({ value: 1 })),
  )
  t.equal(many.statusCode, 400, '1001 messages')
  t.equal(many.json().code, 'invalid_request')
  t.equal((await produce('limits', [])).statusCode, 400, 'no messages')
  const big = await produce('limits', [{ value: 'ok' }, { value: 'x'.repeat(5000) }])
  t.equal(big.statusCode, 413)
  t.match(big.json(), { code: 'message_too_large', index: 1 })
  const bigKey = await produce('limits', [{ value: 'x'.repeat(3000), headers: { h: 'y'.repeat(1500) } }])
  t.equal(bigKey.statusCode, 413, 'headers count towards the size')
  const huge = await produce(
    'limits',
    Array.from({ length: 20 }, () => ({ value: 'x'.repeat(4000) })),
  )
  t.equal(huge.statusCode, 413)
  t.equal(huge.json().code, 'body_too_large')
  t.equal((await fetchAll('limits', 0)).messages.length, 0, 'nothing was stored by any rejected call')
})

t.test('invalid produce bodies are 400 and store nothing', async (t) => {
  await createTopic('strict', 1)
  const bodies: [unknown, string][] = [
    [{}, 'no messages field'],
    [{ messages: [{}] }, 'message without value'],
    [{ messages: [{ value: 1, extra: 1 }] }, 'unknown message field'],
    [{ messages: [{ value: 1 }], extra: 1 }, 'unknown top-level field'],
    [{ messages: [{ value: 1, key: 5 }] }, 'numeric key'],
    [{ messages: [{ value: 1, partition: -1 }] }, 'negative partition'],
    [{ messages: [{ value: 1, partition: '0' }] }, 'partition as a string'],
    [{ messages: [{ value: 1, delayMs: -1 }] }, 'negative delay'],
    [{ messages: [{ value: 1, headers: { a: 1 } }] }, 'non-string header value'],
    [{ messages: [{ value: 1, headers: ['a'] }] }, 'headers as array'],
    [{ messages: [{ value: 1, idempotencyKey: '' }] }, 'empty idempotency key'],
    [{ messages: [{ value: 1, key: 'a\u0000b' }] }, 'NUL in a key'],
    [{ messages: 'nope' }, 'messages not an array'],
  ]
  for (const [body, what] of bodies) {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/topics/strict/messages',
      payload: JSON.stringify(body),
      headers: { 'content-type': 'application/json' },
    })
    t.equal(res.statusCode, 400, what)
    t.equal(res.json().code, 'invalid_request', what)
  }
  t.equal((await produce('no-such-topic', [{ value: 1 }])).json().code, 'topic_not_found')
  t.equal((await fetchAll('strict', 0)).messages.length, 0)
})

t.test('retention deletes old messages; offsets are never reused', async (t) => {
  await app.inject({ method: 'PUT', url: '/v1/topics/aging', payload: { partitions: 1, retentionMs: 60_000 } })
  await produce(
    'aging',
    Array.from({ length: 10 }, (_, i) => ({ value: i })),
  )
  await broker.db.pool.query(
    `UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'aging' AND m."offset" < 6`,
  )
  const deleted = await broker.retention.sweep()
  t.ok(deleted.messages >= 6, "the six aged messages (and any other topic's expired ones) are deleted")
  const page = await fetchAll('aging', 0)
  t.same(
    page.messages.map((m) => m.offset),
    [6, 7, 8, 9],
    'a read from 0 starts at the oldest kept',
  )
  const detail = (await app.inject({ url: '/v1/topics/aging' })).json()
  t.same(detail.partitionStats, [{ partition: 0, startOffset: 6, endOffset: 10 }], 'the oldest offset kept is 6')
  t.same((await produce('aging', [{ value: 'next' }])).json().results, [{ partition: 0, offset: 10 }])
})

t.test('a value nested too deeply, or a key with a lone surrogate, is a 400 that stores nothing', async (t) => {
  await createTopic('odd', 1)
  const deep = '['.repeat(20_000) + ']'.repeat(20_000)
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/odd/messages',
    payload: `{"messages":[{"value":${deep}}]}`,
    headers: { 'content-type': 'application/json' },
  })
  t.equal(res.statusCode, 400)
  t.match(res.json(), { code: 'invalid_request', detail: /nested too deeply/ })
  const lone = await produce('odd', [{ value: 1, idempotencyKey: '\ud800' }])
  t.equal(lone.statusCode, 400)
  const loneKey = await produce('odd', [{ value: 1, key: 'a\udc00' }])
  t.equal(loneKey.statusCode, 400)
  const kept = await produce('odd', [{ value: 'lone \ud800 in a value is kept' }])
  t.equal(kept.statusCode, 201, 'a lone surrogate inside a value is stored as its JSON escape')
  t.equal((await fetchAll('odd', 0)).messages[0]!.value, 'lone \ud800 in a value is kept')
})

t.test('a compressed produce body (gzip, deflate, br) is decompressed; the size limit counts what it inflates to', async (t) => {
  await createTopic('gz', 1)
  const { gzipSync, deflateSync, brotliCompressSync } = await import('node:zlib')
  const encoders = { gzip: gzipSync, deflate: deflateSync, br: brotliCompressSync }
  const expected: unknown[] = []
  for (const [encoding, encode] of Object.entries(encoders)) {
    const messages = Array.from({ length: 20 }, (_, i) => ({ value: { encoding, i, text: 'é'.repeat(100) } }))
    expected.push(...messages.map((m) => m.value))
    const res = await app.inject({
      method: 'POST',
      url: '/v1/topics/gz/messages',
      headers: { 'content-type': 'application/json', 'content-encoding': encoding },
      payload: encode(JSON.stringify({ messages })),
    })
    t.equal(res.statusCode, 201, `${encoding}: ${res.body.slice(0, 200)}`)
  }
  const stored = (await fetchAll('gz', 0)).messages
  t.equal(stored.length, 60, 'all three batches stored')
  t.same(
    stored.map((m) => m.value),
    expected,
    'every value of every batch intact, in order',
  )

  // 65536 bytes is this broker's limit: 1 KiB of gzip inflating to 1 MiB is refused, and stores nothing.
  const bomb = gzipSync(JSON.stringify({ messages: [{ value: 'x'.repeat(1 << 20) }] }))
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/gz/messages',
    headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
    payload: bomb,
  })
  t.equal(res.statusCode, 413)
  t.equal(res.json().code, 'body_too_large')
  t.equal((await fetchAll('gz', 0)).messages.length, 60, 'nothing stored')
})

t.test('POST idempotency-keys answers what a produce with the keys would: the stored ones and where; stores nothing', async (t) => {
  await createTopic('keyed', 2)
  const stored = (await produce('keyed', [{ value: 1, idempotencyKey: 'k-1', partition: 1 }])).json() as { results: { offset: number }[] }
  const ask = (topic: string, payload: object) => app.inject({ method: 'POST', url: `/v1/topics/${topic}/idempotency-keys`, payload })

  const found = await ask('keyed', { keys: ['k-1', 'k-2', 'k-1'] })
  t.equal(found.statusCode, 200, found.body)
  t.same(found.json(), { keys: [{ key: 'k-1', partition: 1, offset: stored.results[0]!.offset }] }, 'k-1 only, once')
  const again = (
    await produce('keyed', [
      { value: 1, idempotencyKey: 'k-1' },
      { value: 2, idempotencyKey: 'k-2' },
    ])
  ).json() as {
    results: { duplicate?: boolean }[]
  }
  t.same(
    again.results.map((r) => r.duplicate === true),
    [true, false],
    'a produce agrees',
  )
  t.same((await fetchAll('keyed', 0)).messages.length + (await fetchAll('keyed', 1)).messages.length, 2, 'the lookup stored nothing')

  const unknown = await ask('nope', { keys: ['k'] })
  t.equal(unknown.statusCode, 404)
  t.equal(unknown.json().code, 'topic_not_found')
  for (const bad of [{ keys: [] }, { keys: [''] }, {}, { keys: Array.from({ length: 1001 }, (_, i) => `k${i}`) }]) {
    const res = await ask('keyed', bad)
    t.equal(res.statusCode, 400, JSON.stringify(bad).slice(0, 40))
    t.match(res.json(), { status: 400, type: /^urn:hookq:problem:/ }, 'a problem document')
  }
})

/**
 * Hostile input on every route of openapi/openapi.json that takes a body or path params: unknown
 * fields, wrong types, wrong media types, compressed bodies, oversized bodies, bad names, broken
 * JSON, duplicate keys, deep nesting and prototype pollution. Every rejection must be a problem
 * document and must leave the database exactly as it was.
 */
import { request as httpRequest } from 'node:http'
import { gzipSync } from 'node:zlib'
import { readFileSync } from 'node:fs'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import type { InjectOptions } from 'fastify'
import type { Broker } from '../../src/broker.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { tableSnapshot } from '../helpers/table-snapshot.ts'
import { waitUntil } from '../helpers/wait.ts'

const MAX_REQUEST_BYTES = 65536
// With a root key, so the key routes (/v1/keys answers 403 without HOOKQ_API_KEYS) are tried too.
const ROOT = 'root-key-of-the-hostile-input-test'
const AUTH = { authorization: `Bearer ${ROOT}` }
const { broker, url: baseUrl } = await startListeningBroker(t, {
  HOOKQ_MAX_REQUEST_BYTES: String(MAX_REQUEST_BYTES),
  HOOKQ_MAX_MESSAGE_BYTES: String(MAX_REQUEST_BYTES),
  HOOKQ_API_KEYS: ROOT,
})
/** The broker's app, every request made with the root key (a request's own authorization wins). */
const app = {
  inject: (opts: InjectOptions | string) => {
    const o: InjectOptions = typeof opts === 'string' ? { url: opts } : opts
    return broker.app.inject({ ...o, headers: { ...AUTH, ...(o.headers as Record<string, string> | undefined) } })
  },
}

type Res = { statusCode: number; headers: Record<string, unknown>; body: string }

// ---- fixtures: a consumed topic with a group and a consumer, and a topic produce may write to ----
async function must(method: 'PUT' | 'POST', url: string, payload: unknown, status: number) {
  const res = await app.inject({ method, url, payload: payload as object })
  if (res.statusCode !== status) throw new Error(`${method} ${url}: ${res.statusCode} ${res.body}`)
  return res.json()
}
await must('PUT', '/v1/topics/base', { partitions: 2 }, 201)
await must('PUT', '/v1/topics/sink', { partitions: 1 }, 201)
await must('PUT', '/v1/groups/g', { topic: 'base' }, 201)
const consumer = (await must('POST', '/v1/groups/g/consumers', { url: 'http://127.0.0.1:9/hook' }, 201)) as { id: string }
// This process claims the group's partitions in the background, each claim a new owner epoch in
// group_offsets: waited for here, so that no snapshot below takes it for a change a request made.
await waitUntil(
  async () => (await broker.db.pool.query('SELECT count(*)::int AS n FROM group_offsets WHERE owner_epoch > 0')).rows[0].n === 2,
  20_000,
  "the group's two partitions claimed",
)

// ---- database snapshot: row count and content hash of every table ----
const TABLES = [
  'topics',
  'topic_partitions',
  'messages',
  'idempotency_keys',
  'consumer_groups',
  'consumers',
  'group_offsets',
  'group_completions',
  'deliveries',
  'schedules',
  'api_keys',
]
const readTables = tableSnapshot(TABLES)
const snapshot = (b: Broker = broker) => readTables(b.db.pool)

/** A 4xx must be application/problem+json with type, title, status, detail and code. */
function assertProblem(t: Test, res: Res, what: string) {
  t.match(String(res.headers['content-type']), /^application\/problem\+json/, `${what}: problem content type`)
  let doc: Record<string, unknown> = {}
  try {
    doc = JSON.parse(res.body)
  } catch {
    t.fail(`${what}: body is not JSON: ${res.body.slice(0, 200)}`)
  }
  for (const k of ['type', 'title', 'detail', 'code']) t.type(doc[k], 'string', `${what}: ${k} is a string`)
  t.equal(doc.status, res.statusCode, `${what}: status member equals the HTTP status`)
  return doc
}

/**
 * Sends a request that must be rejected: checks status (one of `statuses`), code (one of `codes`,
 * if given), the problem document, and that no table changed.
 */
async function rejected(t: Test, what: string, opts: InjectOptions, statuses: number[], codes?: string[]) {
  const before = await snapshot()
  const res = await app.inject(opts)
  t.ok(res.statusCode < 500, `${what}: not a 5xx (got ${res.statusCode} ${res.body.slice(0, 200)})`)
  t.ok(statuses.includes(res.statusCode), `${what}: status ${res.statusCode} is one of ${statuses.join('/')}`)
  const doc = assertProblem(t, res, what)
  if (codes) t.ok(codes.includes(doc.code as string), `${what}: code ${String(doc.code)} is one of ${codes.join('/')}`)
  t.same(await snapshot(), before, `${what}: nothing changed in the database`)
  return res
}

// ---- the routes: every route with a body, and every route with path params, from openapi.json ----
interface BodyRoute {
  method: 'PUT' | 'POST' | 'PATCH'
  path: string
  valid: Record<string, unknown>
  wrongTypes: unknown[]
  nestedUnknown?: Record<string, unknown>
}
const BODY_ROUTES: BodyRoute[] = [
  {
    method: 'PUT',
    path: '/v1/topics/fresh',
    valid: { partitions: 1 },
    wrongTypes: [
      { partitions: '1' },
      { partitions: 1.5 },
      { partitions: true },
      { partitions: null },
      { partitions: [1] },
      { partitions: 0 },
      { partitions: -1 },
      { partitions: 1025 },
      { partitions: 1, retentionMs: '60000' },
      { partitions: 1, retentionMs: 1 },
      {},
      [],
      'x',
      1,
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/topics/base/messages',
    valid: { messages: [{ value: 1 }] },
    nestedUnknown: { messages: [{ value: 1, bogus: 1 }] },
    wrongTypes: [
      { messages: {} },
      { messages: 'x' },
      { messages: [] },
      { messages: [1] },
      { messages: [{}] },
      { messages: [{ value: 1, key: 1 }] },
      { messages: [{ value: 1, partition: '0' }] },
      { messages: [{ value: 1, partition: -1 }] },
      { messages: [{ value: 1, delayMs: -1 }] },
      { messages: [{ value: 1, headers: { a: 1 } }] },
      { messages: [{ value: 1, headers: 'h' }] },
      { messages: [{ value: 1, idempotencyKey: 1 }] },
      {},
      [],
      null,
    ],
  },
  {
    method: 'PUT',
    path: '/v1/groups/g',
    valid: { topic: 'base', maxInFlight: 50 },
    nestedUnknown: { topic: 'base', retry: { initialDelayMs: 1000, bogus: 1 } },
    wrongTypes: [
      { topic: 1 },
      { topic: 'base', ackMode: 'sometimes' },
      { topic: 'base', ackTimeoutMs: '30000' },
      { topic: 'base', maxDeliveries: 0 },
      { topic: 'base', retry: 'fast' },
      { topic: 'base', retry: { multiplier: 'x' } },
      { topic: 'base', ordered: 'yes' },
      { topic: 'base', paused: 1 },
      { topic: 'base', pushFormat: 'xml' },
      { topic: 'base', deadLetterTopic: 'bad name' },
      { topic: 'bad name' },
      {},
      [],
      null,
      { topic: 'base', ordering: 'sometimes' },
      { topic: 'base', ordered: true, ordering: 'key' },
      { topic: 'base', filter: [] },
      { topic: 'base', filter: { nope: 1 } },
      { topic: 'base', filter: { 'value.a': { gt: 'x' } } },
      { topic: 'base', batch: { maxMessages: 0 } },
      { topic: 'base', batch: 10 },
      { topic: 'base', batch: { maxMessages: 10, maxWaitMs: -1 } },
      { topic: 'base', batch: { maxMessages: 10 }, pushFormat: 'raw' },
    ],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/consumers',
    valid: { url: 'http://127.0.0.1:9/other' },
    wrongTypes: [
      { url: 1 },
      { url: 'not a url' },
      { url: 'http://127.0.0.1:9/', secret: 1 },
      { url: 'http://127.0.0.1:9/', secret: 'nope' },
      { url: ['http://127.0.0.1:9/'] },
      {},
      [],
      null,
      { url: 'http://127.0.0.1:9/', rateLimitPerSecond: 0 },
      { url: 'http://127.0.0.1:9/', maxConcurrency: 0 },
      { url: 'http://127.0.0.1:9/', maxConcurrency: '2' },
    ],
  },
  {
    method: 'PATCH',
    path: `/v1/groups/g/consumers/${consumer.id}`,
    valid: { maxConcurrency: 5 },
    wrongTypes: [
      {},
      { url: 1 },
      { url: 'not a url' },
      { rateLimitPerSecond: 0 },
      { rateLimitPerSecond: 'x' },
      { maxConcurrency: 1001 },
      { maxConcurrency: 1.5 },
      { secret: 'whsec_x' },
      [],
      'x',
      null,
    ],
  },
  {
    method: 'POST',
    path: `/v1/groups/g/consumers/${consumer.id}/secret`,
    valid: { secret: `whsec_${Buffer.alloc(32, 9).toString('base64')}`, overlapMs: 1000 },
    wrongTypes: [
      { secret: 1 },
      { secret: 'nope' },
      { secret: `whsec_${Buffer.alloc(12, 9).toString('base64')}` },
      { overlapMs: -1 },
      { overlapMs: '1000' },
      { overlapMs: 604_800_001 },
      { overlapMs: 0.5 },
      [],
      'x',
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/acks',
    valid: { deliveryIds: ['x'] },
    wrongTypes: [
      { deliveryIds: 'x' },
      { deliveryIds: [] },
      { deliveryIds: [1] },
      { deliveryIds: [''] },
      { deliveryIds: ['x'.repeat(129)] },
      { deliveryIds: [null] },
      {},
      [],
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/nacks',
    valid: { deliveryIds: ['x'], delayMs: 0 },
    wrongTypes: [
      { deliveryIds: ['x'], delayMs: -1 },
      { deliveryIds: ['x'], delayMs: '0' },
      { deliveryIds: ['x'], deadLetter: 'true' },
      { deliveryIds: 'x' },
      {},
      [],
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/topics/base/idempotency-keys',
    valid: { keys: ['order-1'] },
    wrongTypes: [{ keys: [] }, { keys: 'order-1' }, { keys: [1] }, { keys: [''] }, {}, [], 'x', null],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/extend',
    valid: { deliveryIds: ['x'], extendMs: 1000 },
    wrongTypes: [
      { deliveryIds: ['x'] },
      { deliveryIds: ['x'], extendMs: 0 },
      { deliveryIds: ['x'], extendMs: '1000' },
      { deliveryIds: ['x'], extendMs: 1e12 },
      {},
      [],
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/pull',
    valid: { maxMessages: 1 },
    wrongTypes: [
      { maxMessages: 0 },
      { maxMessages: 1001 },
      { maxMessages: '1' },
      { waitMs: 20_001 },
      { waitMs: -1 },
      { leaseMs: 999 },
      { other: 1 },
      [],
      'x',
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/groups/g/seek',
    valid: { offset: 0 },
    wrongTypes: [
      { offset: -1 },
      { offset: '0' },
      { partition: 'x', offset: 0 },
      { timestamp: 'yesterday' },
      { offset: 0, timestamp: '2026-01-01T00:00:00Z' },
      [],
      'x',
      null,
    ],
  },
  {
    method: 'POST',
    path: '/v1/keys',
    valid: { name: 'svc', scopes: [{ action: 'produce', topics: ['orders.*'] }] },
    nestedUnknown: { name: 'svc', scopes: [{ action: 'produce', bogus: 1 }] },
    wrongTypes: [
      { name: 1, scopes: [{ action: 'produce' }] },
      { name: 'svc', scopes: [] },
      { name: 'svc', scopes: [{ action: 'root' }] },
      { name: 'svc', scopes: [{ action: 'produce', topics: 'orders' }] },
      { name: 'svc', scopes: [{ action: 'produce', topics: ['bad name'] }] },
      { name: 'svc', scopes: [{ action: 'produce' }], expiresAt: 'tomorrow' },
      { scopes: [{ action: 'produce' }] },
      {},
      [],
      null,
    ],
  },
  {
    method: 'PUT',
    path: '/v1/schedules/s',
    // A cron that does not tick while the test runs: a tick would change the snapshot.
    valid: { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1 } },
    nestedUnknown: { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1, bogus: 1 } },
    wrongTypes: [
      { topic: 'sink', cron: 1, message: { value: 1 } },
      { topic: 'sink', cron: '0 0 1 1', message: { value: 1 } },
      { topic: 'sink', cron: '0 0 1 1 *', every: 1000, message: { value: 1 } },
      { topic: 'sink', message: { value: 1 } },
      { topic: 'sink', every: 999, message: { value: 1 } },
      { topic: 'sink', every: '1000', message: { value: 1 } },
      { topic: 'sink', cron: '0 0 1 1 *', timeZone: 'Nowhere/Town', message: { value: 1 } },
      { topic: 'sink', cron: '0 0 1 1 *', message: 1 },
      { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1, headers: { a: 1 } } },
      { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1 }, missed: 'all' },
      { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1 }, paused: 'no' },
      { topic: 'bad name', cron: '0 0 1 1 *', message: { value: 1 } },
      {},
      [],
      null,
    ],
  },
]

/** Every route with path params, as a template of its params ({topic}, {group}, {partition}, {id}). */
const PARAM_ROUTES: { method: 'GET' | 'PUT' | 'POST' | 'PATCH' | 'DELETE'; template: string; body?: unknown }[] = [
  { method: 'PUT', template: '/v1/topics/{topic}', body: { partitions: 1 } },
  { method: 'GET', template: '/v1/topics/{topic}' },
  { method: 'DELETE', template: '/v1/topics/{topic}' },
  { method: 'POST', template: '/v1/topics/{topic}/messages', body: { messages: [{ value: 1 }] } },
  { method: 'GET', template: '/v1/topics/{topic}/partitions/{partition}/messages' },
  { method: 'POST', template: '/v1/topics/{topic}/idempotency-keys', body: { keys: ['order-1'] } },
  { method: 'PUT', template: '/v1/groups/{group}', body: { topic: 'base' } },
  { method: 'GET', template: '/v1/groups/{group}' },
  { method: 'DELETE', template: '/v1/groups/{group}' },
  { method: 'POST', template: '/v1/groups/{group}/consumers', body: { url: 'http://127.0.0.1:9/x' } },
  { method: 'GET', template: '/v1/groups/{group}/consumers' },
  { method: 'PATCH', template: '/v1/groups/{group}/consumers/{id}', body: { maxConcurrency: 5 } },
  { method: 'DELETE', template: '/v1/groups/{group}/consumers/{id}' },
  {
    method: 'POST',
    template: '/v1/groups/{group}/consumers/{id}/secret',
    body: { secret: `whsec_${Buffer.alloc(32, 9).toString('base64')}` },
  },
  { method: 'POST', template: '/v1/groups/{group}/acks', body: { deliveryIds: ['x'] } },
  { method: 'POST', template: '/v1/groups/{group}/nacks', body: { deliveryIds: ['x'] } },
  { method: 'POST', template: '/v1/groups/{group}/extend', body: { deliveryIds: ['x'], extendMs: 1000 } },
  { method: 'POST', template: '/v1/groups/{group}/pull', body: {} },
  { method: 'GET', template: '/v1/groups/{group}/deliveries' },
  { method: 'POST', template: '/v1/groups/{group}/seek', body: { offset: 0 } },
  { method: 'PUT', template: '/v1/schedules/{name}', body: { topic: 'sink', cron: '0 0 1 1 *', message: { value: 1 } } },
  { method: 'GET', template: '/v1/schedules/{name}' },
  { method: 'DELETE', template: '/v1/schedules/{name}' },
  { method: 'DELETE', template: '/v1/keys/{id}' },
]
const GOOD_PARAMS: Record<string, string> = { topic: 'base', group: 'g', partition: '0', id: consumer.id, name: 's' }
const fill = (template: string, params: Record<string, string>) =>
  template.replace(/\{(\w+)\}/g, (_, k: string) => params[k] ?? GOOD_PARAMS[k]!)

t.test('the tables cover every route of openapi.json that takes a body or path params', async (t) => {
  const spec = JSON.parse(readFileSync(new URL('../../openapi/openapi.json', import.meta.url), 'utf8')) as {
    paths: Record<string, Record<string, { requestBody?: unknown; parameters?: { in: string }[] }>>
  }
  const withBody: string[] = []
  const withParams: string[] = []
  for (const [path, ops] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      if (op.requestBody) withBody.push(`${method.toUpperCase()} ${path}`)
      if (op.parameters?.some((p) => p.in === 'path')) withParams.push(`${method.toUpperCase()} ${path}`)
    }
  }
  const bodyTemplates = BODY_ROUTES.map(
    (r) =>
      `${r.method} ${r.path.replace('/fresh', '/{topic}').replace('/base/', '/{topic}/').replace('/g/', '/{group}/').replace(/\/g$/, '/{group}').replace(consumer.id, '{id}').replace('/schedules/s', '/schedules/{name}')}`,
  )
  t.same([...bodyTemplates].sort(), [...withBody].sort(), 'BODY_ROUTES = the routes with a request body')
  t.same(PARAM_ROUTES.map((r) => `${r.method} ${r.template}`).sort(), [...withParams].sort(), 'PARAM_ROUTES = the routes with path params')
})

t.test('the snapshot is stable while nothing is written', async (t) => {
  const a = await snapshot()
  await new Promise((r) => setTimeout(r, 300))
  t.same(await snapshot(), a)
})

const json = { 'content-type': 'application/json' }

for (const route of BODY_ROUTES) {
  const what = `${route.method} ${route.path}`
  t.test(`${what}: unknown fields are 400 invalid_request`, async (t) => {
    await rejected(
      t,
      `${what} + top-level field`,
      { method: route.method, url: route.path, headers: json, payload: JSON.stringify({ ...route.valid, bogus: 1 }) },
      [400],
      ['invalid_request'],
    )
    await rejected(
      t,
      `${what} + field named like a column`,
      {
        method: route.method,
        url: route.path,
        headers: json,
        payload: JSON.stringify({ ...route.valid, id: 1, createdAt: 'x', topic_id: 1 }),
      },
      [400],
      ['invalid_request'],
    )
    if (route.nestedUnknown) {
      await rejected(
        t,
        `${what} + nested field`,
        { method: route.method, url: route.path, headers: json, payload: JSON.stringify(route.nestedUnknown) },
        [400],
        ['invalid_request'],
      )
    }
  })

  t.test(`${what}: wrong types and out-of-range values are 400`, async (t) => {
    for (const body of route.wrongTypes) {
      await rejected(
        t,
        `${what} ${JSON.stringify(body)}`,
        { method: route.method, url: route.path, headers: json, payload: JSON.stringify(body) },
        [400],
        ['invalid_request'],
      )
    }
  })

  t.test(`${what}: media types other than JSON are rejected`, async (t) => {
    const asJson = JSON.stringify(route.valid)
    const form = new URLSearchParams(Object.entries(route.valid).map(([k, v]): [string, string] => [k, String(v)])).toString()
    const multipart = `--xx\r\nContent-Disposition: form-data; name="body"\r\n\r\n${asJson}\r\n--xx--\r\n`
    const cases: [string, string | undefined, string][] = [
      ['application/x-www-form-urlencoded', 'application/x-www-form-urlencoded', form],
      ['multipart/form-data', 'multipart/form-data; boundary=xx', multipart],
      ['application/xml', 'application/xml', '<partitions>1</partitions>'],
      ['application/problem+json', 'application/problem+json', asJson],
      ['no content-type', undefined, asJson],
    ]
    for (const [label, ct, payload] of cases) {
      await rejected(
        t,
        `${what} as ${label}`,
        { method: route.method, url: route.path, headers: ct ? { 'content-type': ct } : {}, payload },
        [415],
        ['unsupported_media_type'],
      )
    }
    // text/plain: Fastify has a built-in text/plain parser, so the body arrives as a string and
    // fails validation (400) instead of 415. Safe (nothing is written), but not the expected code.
    const res = await rejected(
      t,
      `${what} as text/plain`,
      { method: route.method, url: route.path, headers: { 'content-type': 'text/plain' }, payload: asJson },
      [400, 415],
    )
    t.equal(res.statusCode, 415, `${what} as text/plain → 415 unsupported_media_type`)
  })

  t.test(`${what}: compressed bodies: a bomb is 413, corrupt or unknown encodings are refused`, async (t) => {
    // bodyLimit counts decompressed bytes: ~64 KiB of gzip that inflates past the limit is a 413.
    const bomb = gzipSync(JSON.stringify({ ...route.valid, pad: 'x'.repeat(MAX_REQUEST_BYTES * 16) }))
    t.ok(bomb.length < MAX_REQUEST_BYTES, 'the bomb itself is under the limit')
    await rejected(
      t,
      `${what} gzip bomb`,
      { method: route.method, url: route.path, headers: { ...json, 'content-encoding': 'gzip' }, payload: bomb },
      [413],
      ['body_too_large'],
    )
    const deflated = gzipSync(Buffer.from('{}')).subarray(10)
    await rejected(
      t,
      `${what} deflate garbage`,
      { method: route.method, url: route.path, headers: { ...json, 'content-encoding': 'deflate' }, payload: deflated },
      [400],
      ['invalid_json'],
    )
    await rejected(
      t,
      `${what} zstd`,
      { method: route.method, url: route.path, headers: { ...json, 'content-encoding': 'zstd' }, payload: gzipSync('{}') },
      [415],
      ['unsupported_media_type'],
    )
  })

  t.test(`${what}: a body over HOOKQ_MAX_REQUEST_BYTES is 413 body_too_large`, async (t) => {
    const pad = 'x'.repeat(MAX_REQUEST_BYTES + 10)
    await rejected(
      t,
      `${what} oversized`,
      { method: route.method, url: route.path, headers: json, payload: JSON.stringify({ ...route.valid, pad }) },
      [413],
      ['body_too_large'],
    )
    const whitespace = JSON.stringify(route.valid) + ' '.repeat(MAX_REQUEST_BYTES)
    await rejected(
      t,
      `${what} oversized by whitespace`,
      { method: route.method, url: route.path, headers: json, payload: whitespace },
      [413],
      ['body_too_large'],
    )
  })

  t.test(`${what}: JSON syntax errors are 400 invalid_json`, async (t) => {
    const broken = [
      '{',
      '{"a":}',
      "{'a':1}",
      '{"a":1,}',
      '[1,]',
      '{"a":1} trailing',
      'nul',
      '{"a":"\u0000"',
      '{"a":1e}',
      '{"a":NaN}',
      '{"a":Infinity}',
      '{"a":0x10}',
      '{"a":undefined}',
      '/*c*/{}',
      '   ',
    ]
    for (const payload of broken) {
      await rejected(
        t,
        `${what} ${JSON.stringify(payload)}`,
        { method: route.method, url: route.path, headers: json, payload },
        [400],
        ['invalid_json'],
      )
    }
  })

  t.test(`${what}: a leading byte-order mark is not a syntax error (stripped, as RFC 8259 allows)`, async (t) => {
    // Observed: the BOM is ignored. Sent with an unknown field so it is rejected and writes nothing.
    await rejected(
      t,
      `${what} BOM`,
      { method: route.method, url: route.path, headers: json, payload: `\uFEFF${JSON.stringify({ ...route.valid, bogus: 1 })}` },
      [400],
      ['invalid_request'],
    )
  })

  t.test(`${what}: prototype pollution attempts are 400 and pollute nothing`, async (t) => {
    const valid = JSON.stringify(route.valid).slice(1, -1)
    const attacks = [
      `{"__proto__":{"polluted":true},${valid}}`,
      `{${valid},"constructor":{"prototype":{"polluted":true}}}`,
      `{${valid},"__proto__":{"polluted":true,"partitions":1}}`,
      `{${valid},"nested":{"__proto__":{"polluted":true}}}`,
      `{${valid},"\\u005f\\u005fproto\\u005f\\u005f":{"polluted":true}}`,
    ]
    for (const payload of attacks) {
      await rejected(
        t,
        `${what} ${payload}`,
        { method: route.method, url: route.path, headers: json, payload },
        [400],
        ['invalid_json', 'invalid_request'],
      )
      t.equal(({} as Record<string, unknown>).polluted, undefined, 'Object.prototype not polluted')
      t.equal((Object.prototype as Record<string, unknown>).polluted, undefined)
    }
  })
}

t.test('prototype-pollution keys inside a produce value are stored as sent and pollute nothing', async (t) => {
  // Valid JSON: parsed as JSON.parse does (own members, never a prototype), and a value comes back as sent.
  for (const value of [
    '{"__proto__":{"polluted":true}}',
    '{"constructor":{"prototype":{"polluted":true}}}',
    '[{"a":{"__proto__":{"polluted":true}}}]',
  ]) {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/topics/sink/messages',
      headers: json,
      payload: `{"messages":[{"value":${value}}]}`,
    })
    t.equal(res.statusCode, 201, `produce value ${value}: ${res.body.slice(0, 200)}`)
    const { partition, offset } = res.json().results[0]
    const read = await app.inject({ url: `/v1/topics/sink/partitions/${partition}/messages?fromOffset=${offset}&limit=1` })
    t.ok(read.body.includes(`"value":${value}`), `produce value ${value}: comes back as sent`)
  }
  t.equal(({} as Record<string, unknown>).polluted, undefined)
})

t.test('duplicate keys in JSON: the last one wins, deterministically, never a 5xx', async (t) => {
  const payload = '{"partitions":1,"partitions":2}'
  const first = await app.inject({ method: 'PUT', url: '/v1/topics/dupkeys', headers: json, payload })
  t.equal(first.statusCode, 201, first.body)
  t.equal(first.json().partitions, 2, 'as JSON.parse: the last duplicate wins')
  const again = await app.inject({ method: 'PUT', url: '/v1/topics/dupkeys', headers: json, payload })
  t.equal(again.statusCode, 200, 'a repeat is the same config (200), so the same value was read')
  const reversed = await rejected(
    t,
    'reversed duplicate',
    { method: 'PUT', url: '/v1/topics/dupkeys', headers: json, payload: '{"partitions":2,"partitions":1}' },
    [409],
    ['topic_conflict'],
  )
  t.ok(reversed)
  // A duplicate whose first value is invalid and last valid (and vice versa).
  const lastValid = await app.inject({
    method: 'PUT',
    url: '/v1/topics/dupkeys2',
    headers: json,
    payload: '{"partitions":"x","partitions":1}',
  })
  t.equal(lastValid.statusCode, 201, 'the invalid first duplicate is overwritten before validation')
  await rejected(
    t,
    'last duplicate invalid',
    { method: 'PUT', url: '/v1/topics/dupkeys3', headers: json, payload: '{"partitions":1,"partitions":"x"}' },
    [400],
    ['invalid_request'],
  )
  // In the ack routes too.
  const ack = await app.inject({
    method: 'POST',
    url: '/v1/groups/g/acks',
    headers: json,
    payload: '{"deliveryIds":["a"],"deliveryIds":["b","c"]}',
  })
  t.equal(ack.statusCode, 200)
  t.same(
    ack.json().results.map((r: { deliveryId: string }) => r.deliveryId),
    ['b', 'c'],
  )
})

t.test('deeply nested values never crash the broker', async (t) => {
  for (const depth of [1000, 10_000]) {
    for (const [label, value] of [
      ['arrays', '['.repeat(depth) + ']'.repeat(depth)],
      ['objects', `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`],
    ] as const) {
      const before = await snapshot()
      const res = await app.inject({
        method: 'POST',
        url: '/v1/topics/sink/messages',
        headers: json,
        payload: `{"messages":[{"value":${value}}]}`,
      })
      const what = `produce a value of ${depth} nested ${label}`
      t.ok(res.statusCode < 500, `${what}: 4xx or 201, never a 5xx (got ${res.statusCode} ${res.body.slice(0, 160)})`)
      if (res.statusCode >= 400) {
        assertProblem(t, res, what)
        t.same(await snapshot(), before, `${what}: rejected, nothing stored`)
      } else {
        t.equal(res.statusCode, 201, what)
        const stored = await broker.db.pool.query(
          `SELECT length(m.value::text) AS n FROM messages m JOIN topics tp ON tp.id = m.topic_id WHERE tp.name = 'sink' ORDER BY m."offset" DESC LIMIT 1`,
        )
        t.equal(Number(stored.rows[0].n), value.length, `${what}: stored whole`)
      }
      const health = await app.inject({ url: '/healthz' })
      t.equal(health.statusCode, 200, `${what}: /healthz still answers`)
    }
  }
  // Deep nesting in the other bodies hits validation (wrong type), never the stack.
  for (const route of BODY_ROUTES) {
    const deep = '['.repeat(10_000) + ']'.repeat(10_000)
    const payload = JSON.stringify({ ...route.valid, bogus: 0 }).replace('0}', `${deep}}`)
    await rejected(
      t,
      `${route.method} ${route.path} with 10000 nested arrays`,
      { method: route.method, url: route.path, headers: json, payload },
      [400],
      ['invalid_request'],
    )
  }
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200)
})

t.test('bad names in path params are 400 on every route', async (t) => {
  const badNames = ['a b', 'a'.repeat(250), 'é', 'ünïcødé', '日本語', '🦊', 'a/b', 'a\u0000b', 'a%b', "a'b", 'a"b', 'a;b', 'a\nb', ' ', '']
  for (const route of PARAM_ROUTES) {
    for (const param of route.template.match(/\{(\w+)\}/g)!.map((p) => p.slice(1, -1))) {
      if (param === 'partition' || param === 'id') continue
      for (const bad of badNames) {
        const url = fill(route.template, { [param]: encodeURIComponent(bad) })
        const what = `${route.method} ${route.template} ${param}=${JSON.stringify(bad.length > 20 ? `${bad.slice(0, 8)}…(${bad.length})` : bad)}`
        await rejected(
          t,
          what,
          { method: route.method, url, ...(route.body ? { headers: json, payload: JSON.stringify(route.body) } : {}) },
          [400],
          ['invalid_request'],
        )
      }
      // Past Fastify's maxParamLength (300) the router answers 414 itself; it must still be a problem document.
      const long = fill(route.template, { [param]: 'a'.repeat(400) })
      await rejected(
        t,
        `${route.method} ${route.template} ${param} of 400 chars`,
        { method: route.method, url: long, ...(route.body ? { headers: json, payload: JSON.stringify(route.body) } : {}) },
        [400, 404, 414],
        ['invalid_request', 'route_not_found', 'uri_too_long'],
      )
    }
  }
})

t.test('bad partition and consumer-id params are 4xx, never 5xx', async (t) => {
  for (const p of ['x', '-1', '1.5', '1e3', '99999999999999999999', '2147483648', '9007199254740993', '', 'NaN', 'Infinity']) {
    const res = await rejected(
      t,
      `partition ${JSON.stringify(p)}`,
      { url: `/v1/topics/base/partitions/${encodeURIComponent(p)}/messages` },
      [400, 404],
    )
    t.ok(res)
  }
  for (const q of [
    'fromOffset=99999999999999999999',
    'fromOffset=9223372036854775808',
    'fromOffset=-1',
    'limit=1e9',
    'limit=abc',
    'fromOffset=1&fromOffset=2',
  ]) {
    const res = await app.inject({ url: `/v1/topics/base/partitions/0/messages?${q}` })
    t.ok(res.statusCode < 500, `query ${q}: not a 5xx (${res.statusCode} ${res.body.slice(0, 160)})`)
    if (res.statusCode >= 400) assertProblem(t, res, `query ${q}`)
  }
  for (const q of [
    'partition=99999999999999999999',
    'offset=9223372036854775808',
    'cursor=%00',
    `cursor=${'a'.repeat(513)}`,
    'outcome=exploded',
    'limit=0',
  ]) {
    const res = await app.inject({ url: `/v1/groups/g/deliveries?${q}` })
    t.ok(res.statusCode < 500, `deliveries ${q}: not a 5xx (${res.statusCode} ${res.body.slice(0, 160)})`)
    if (res.statusCode >= 400) assertProblem(t, res, `deliveries ${q}`)
  }
  for (const id of ['a'.repeat(65), 'é', 'a b', '%00', "x' OR '1'='1", '..%2F..']) {
    await rejected(
      t,
      `consumer id ${JSON.stringify(id.slice(0, 20))}`,
      { method: 'DELETE', url: `/v1/groups/g/consumers/${encodeURIComponent(id)}` },
      [400, 404],
      ['invalid_request', 'consumer_not_found'],
    )
  }
})

const NUL = '\u0000'
const SECRET = `whsec_${Buffer.alloc(32, 9).toString('base64')}`

t.test('NUL in any string field of any body is 400 invalid_request and changes nothing', async (t) => {
  // PostgreSQL text cannot hold NUL: every string the schemas type as a string refuses it.
  const cases: [string, string, unknown][] = [
    ['POST', '/v1/topics/sink/messages', { messages: [{ value: 1, key: `k${NUL}` }] }],
    ['POST', '/v1/topics/sink/messages', { messages: [{ value: 1, key: NUL }] }],
    ['POST', '/v1/topics/sink/messages', { messages: [{ value: 1, idempotencyKey: `i${NUL}` }] }],
    ['POST', '/v1/topics/sink/messages', { messages: [{ value: 1, headers: { [`a${NUL}`]: 'v' } }] }],
    ['POST', '/v1/topics/sink/messages', { messages: [{ value: 1, headers: { [NUL]: 'v' } }] }],
    ['PUT', '/v1/groups/g', { topic: `base${NUL}` }],
    ['PUT', '/v1/groups/g', { topic: 'base', deadLetterTopic: `sink${NUL}` }],
    ['PUT', '/v1/groups/g', { topic: 'base', ackMode: `auto${NUL}` }],
    ['PUT', '/v1/groups/g', { topic: 'base', pushFormat: `raw${NUL}` }],
    ['PUT', '/v1/groups/g', { topic: 'base', startAt: `earliest${NUL}` }],
    ['PUT', '/v1/groups/g', { topic: 'base', startAt: `2026-01-01T00:00:00Z${NUL}` }],
    ['PUT', '/v1/groups/nul-new', { topic: 'base', startAt: `2026-01-01T00:00:00Z${NUL}` }],
    ['POST', '/v1/groups/g/consumers', { url: `http://127.0.0.1:9/${NUL}` }],
    ['POST', '/v1/groups/g/consumers', { url: `http://127.0.0.1${NUL}.evil.test/` }],
    ['POST', '/v1/groups/g/consumers', { url: 'http://127.0.0.1:9/', secret: `${SECRET}${NUL}` }],
    ['POST', `/v1/groups/g/consumers/${consumer.id}/secret`, { secret: `${SECRET}${NUL}` }],
    ['POST', '/v1/groups/g/seek', { timestamp: `2026-01-01T00:00:00Z${NUL}` }],
  ]
  for (const path of ['acks', 'nacks', 'extend']) {
    for (const ids of [[NUL], [`a${NUL}b`], ['ok', NUL]]) {
      cases.push(['POST', `/v1/groups/g/${path}`, { deliveryIds: ids, ...(path === 'extend' ? { extendMs: 1000 } : {}) }])
    }
  }
  for (const [method, url, body] of cases) {
    const res = await rejected(
      t,
      `${method} ${url} ${JSON.stringify(body)}`,
      { method: method as 'PUT', url, headers: json, payload: JSON.stringify(body) },
      [400],
      ['invalid_request'],
    )
    t.match(res.body, /NUL|date-time|not a valid URL|format|pattern|constant/, 'the detail says what is wrong')
  }
})

t.test('NUL in any path param or query string is 400 and changes nothing', async (t) => {
  for (const route of PARAM_ROUTES) {
    for (const param of route.template.match(/\{(\w+)\}/g)!.map((p) => p.slice(1, -1))) {
      for (const bad of [NUL, `a${NUL}b`, `${GOOD_PARAMS[param]}${NUL}`]) {
        const url = fill(route.template, { [param]: encodeURIComponent(bad) })
        await rejected(
          t,
          `${route.method} ${route.template} ${param}=${JSON.stringify(bad)}`,
          { method: route.method, url, ...(route.body ? { headers: json, payload: JSON.stringify(route.body) } : {}) },
          [400],
          ['invalid_request'],
        )
      }
    }
  }
  const cursor = (text: string) => Buffer.from(text).toString('base64url')
  for (const q of [
    'cursor=%00',
    `cursor=${cursor(`2026-01-01T00:00:00.000Z a${NUL}b`)}`,
    'outcome=acked%00',
    'partition=%00',
    'limit=1%00',
  ]) {
    await rejected(t, `deliveries ?${q}`, { url: `/v1/groups/g/deliveries?${q}` }, [400], ['invalid_request', 'invalid_cursor'])
  }
  await rejected(t, 'fetch ?fromOffset=%00', { url: '/v1/topics/base/partitions/0/messages?fromOffset=%00' }, [400], ['invalid_request'])
})

t.test('NUL stays allowed where it is stored as JSON text: message values and header values', async (t) => {
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/sink/messages',
    headers: json,
    payload: JSON.stringify({ messages: [{ value: { s: `a${NUL}b` }, headers: { h: `v${NUL}` }, partition: 0 }] }),
  })
  t.equal(res.statusCode, 201, res.body)
  const { offset } = res.json().results[0]
  const read = await app.inject({ url: `/v1/topics/sink/partitions/0/messages?fromOffset=${offset}&limit=1` })
  t.same(read.json().messages[0].value, { s: `a${NUL}b` }, 'the value comes back with its NUL')
  t.same(read.json().messages[0].headers, { h: `v${NUL}` }, 'the header value too')
})

t.test('header names: 1 to 256 characters, no NUL', async (t) => {
  for (const name of ['', 'h'.repeat(257), NUL, `x${NUL}`]) {
    await rejected(
      t,
      `header name ${JSON.stringify(name.slice(0, 10))} (${name.length})`,
      {
        method: 'POST',
        url: '/v1/topics/sink/messages',
        headers: json,
        payload: JSON.stringify({ messages: [{ value: 1, headers: { ok: 'v', [name]: 'v' } }] }),
      },
      [400],
      ['invalid_request'],
    )
  }
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/sink/messages',
    headers: json,
    payload: JSON.stringify({ messages: [{ value: 1, headers: { ['h'.repeat(256)]: 'v' } }] }),
  })
  t.equal(res.statusCode, 201, 'a 256-character name is fine')
})

// Dates Date.parse takes but RFC 3339 does not, and ones PostgreSQL cannot store.
const BAD_TIMES = [
  '-271821-04-20T00:00:00Z',
  '+275760-09-13T00:00:00Z',
  '2026',
  '2026-01-01',
  'Thu, 01 Jan 2026 00:00:00 GMT',
  'January 1, 2026',
  '2026-01-01T00:00:00',
  '2016-12-31T23:59:60Z',
  '2026-02-30T00:00:00Z',
  '1e12',
  'now',
]

t.test('startAt and seek timestamps: RFC 3339 date-times PostgreSQL can store, or 400', async (t) => {
  for (const at of BAD_TIMES) {
    await rejected(
      t,
      `create a group with startAt ${at}`,
      { method: 'PUT', url: '/v1/groups/times', headers: json, payload: JSON.stringify({ topic: 'base', startAt: at }) },
      [400],
      ['invalid_request'],
    )
    await rejected(
      t,
      `update a group with startAt ${at}`,
      { method: 'PUT', url: '/v1/groups/g', headers: json, payload: JSON.stringify({ topic: 'base', startAt: at }) },
      [400],
      ['invalid_request'],
    )
    await rejected(
      t,
      `seek to ${at}`,
      { method: 'POST', url: '/v1/groups/g/seek', headers: json, payload: JSON.stringify({ timestamp: at }) },
      [400],
      ['invalid_request'],
    )
  }
  const cursor = Buffer.from('-271821-04-20T00:00:00.000Z x').toString('base64url')
  await rejected(
    t,
    'a forged cursor with a time PostgreSQL cannot store',
    { url: `/v1/groups/g/deliveries?cursor=${cursor}` },
    [400],
    ['invalid_cursor'],
  )
  for (const at of ['2026-01-01T00:00:00Z', '2026-01-01T01:00:00+01:00', '0001-01-01T00:00:00.5Z']) {
    const res = await app.inject({ method: 'POST', url: '/v1/groups/g/seek', headers: json, payload: JSON.stringify({ timestamp: at }) })
    t.equal(res.statusCode, 200, `seek to ${at}`)
  }
  const created = await app.inject({
    method: 'PUT',
    url: '/v1/groups/times-ok',
    headers: json,
    payload: JSON.stringify({ topic: 'base', startAt: '0001-01-01T00:00:00Z' }),
  })
  t.equal(created.statusCode, 201, created.body)
  t.equal((await app.inject({ method: 'DELETE', url: '/v1/groups/times-ok' })).statusCode, 204)
})

// URLs RFC 3986 syntax (the schema's format: uri) passes but the WHATWG parser (the pusher's) refuses.
const UNPARSABLE_URLS = [
  'http://example.com:65536/',
  'http://example.com:99999/',
  'http://example.com:-1/',
  'http://example.com:80:80/',
  'http://127.0.0.1%2F',
  'http://127.0.0.1%00.evil.com',
  'http://xn--localhost/',
  'http://[::1/',
  'http://exa mple.com/',
]

t.test('consumer URLs the URL parser refuses are 400, never a 5xx', async (t) => {
  for (const url of UNPARSABLE_URLS) {
    await rejected(
      t,
      `consumer url ${url}`,
      { method: 'POST', url: '/v1/groups/g/consumers', headers: json, payload: JSON.stringify({ url }) },
      [400],
      ['invalid_request', 'url_not_allowed'],
    )
  }
})

t.test('numbers in paths and query strings are plain decimal integers', async (t) => {
  for (const p of ['0x1', '+1', '00', '01', '-0', ' 1', '1 ', '1e0', '1.0', '0b1', '0o1']) {
    await rejected(
      t,
      `partition ${JSON.stringify(p)}`,
      { url: `/v1/topics/base/partitions/${encodeURIComponent(p)}/messages` },
      [400],
      ['invalid_request'],
    )
  }
  for (const q of ['fromOffset=0x10', 'fromOffset=+1', 'fromOffset=010', 'limit=0x10', 'limit=1e1', 'fromOffset=1&fromOffset=0x2']) {
    await rejected(t, `fetch ?${q}`, { url: `/v1/topics/base/partitions/0/messages?${q}` }, [400], ['invalid_request'])
  }
  for (const q of ['partition=0x1', 'offset=+1', 'limit=1.0']) {
    await rejected(t, `deliveries ?${q}`, { url: `/v1/groups/g/deliveries?${q}` }, [400], ['invalid_request'])
  }
  for (const q of ['fromOffset=0', 'fromOffset=10', 'limit=1']) {
    t.equal((await app.inject({ url: `/v1/topics/base/partitions/1/messages?${q}` })).statusCode, 200, q)
  }
})

/** A raw HTTP request: the path goes on the wire as given (inject and fetch resolve dot segments). */
function raw(method: string, path: string, body?: unknown): Promise<Res> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body)
    const req = httpRequest(
      `${baseUrl}/`,
      {
        method,
        path,
        headers: { ...AUTH, ...(payload ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } : {}) },
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('end', () => resolve({ statusCode: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
      },
    )
    req.on('error', reject)
    req.end(payload)
  })
}

t.test('dot-segment names over raw HTTP: never a 5xx', async (t) => {
  const accepted: string[] = []
  // `.` and `..` match the contract's name pattern ^[A-Za-z0-9._-]{1,249}$, so the broker accepts
  // them; but clients that normalise URLs (fetch, curl, inject) can never address such a resource.
  for (const name of ['..', '.', '%2E%2E', '%2e']) {
    for (const route of PARAM_ROUTES) {
      for (const param of route.template.match(/\{(\w+)\}/g)!.map((p) => p.slice(1, -1))) {
        if (param === 'partition') continue
        const before = await snapshot()
        const res = await raw(route.method, fill(route.template, { [param]: name }), route.body)
        const what = `raw ${route.method} ${route.template} ${param}=${name}`
        t.ok(res.statusCode < 500, `${what}: not a 5xx (${res.statusCode} ${res.body.slice(0, 160)})`)
        if (res.statusCode >= 400) {
          assertProblem(t, res, what)
          t.same(await snapshot(), before, `${what}: rejected, nothing changed`)
        } else if (res.statusCode < 300) {
          accepted.push(`${route.method} ${fill(route.template, { [param]: name })} → ${res.statusCode}`)
        }
      }
    }
  }
  if (accepted.length) t.comment(`accepted with dot-segment names:\n${accepted.join('\n')}`)
  t.same(
    accepted.filter((a) => a.startsWith('PUT') || a.startsWith('POST /v1/topics')),
    [],
    'no topic or group named "." or ".." is created or written',
  )
  // Clean up anything the raw requests created so later tests start from the fixtures.
  await raw('DELETE', '/v1/groups/..')
  await raw('DELETE', '/v1/groups/.')
  await raw('DELETE', '/v1/topics/..')
  await raw('DELETE', '/v1/topics/.')
})

t.test('the broker is still healthy and unpolluted at the end', async (t) => {
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200)
  t.equal(({} as Record<string, unknown>).polluted, undefined)
  const res = await app.inject({ method: 'POST', url: '/v1/topics/base/messages', payload: { messages: [{ value: 'still works' }] } })
  t.equal(res.statusCode, 201)
})

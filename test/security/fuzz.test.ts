/**
 * Property-based fuzzing of every write route with fast-check: arbitrary JSON bodies, mutations of
 * valid bodies and arbitrary path params. Properties: never a 5xx; every 4xx is a problem document;
 * a 4xx leaves every table exactly as it was. Seeded (HOOKQ_FUZZ_SEED overrides); the seed and the
 * counterexample are printed on failure. numRuns is bounded so the file finishes well under 60 s:
 * 50 a route in `npm test`, 200 in `npm run test:faults` (HOOKQ_FUZZ_RUNS), and every kind of case
 * (each way of making a name, a body and a JSON value, each mutation) is checked to come up.
 */
import fc from 'fast-check'
import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'
import { tableSnapshot } from '../helpers/table-snapshot.ts'

const SEED = Number(process.env.HOOKQ_FUZZ_SEED ?? 20261130)
const RUNS = Number(process.env.HOOKQ_FUZZ_RUNS ?? 50)

/** The kinds of case generated, as "<route>: <kind>" (names, bodies, mutations) and "json: <kind>". */
const made = new Set<string>()
/** `arb`, recording `label` each time it makes a value (shrinking included: a kind made is a kind sent). */
const kind = <T>(label: () => string, arb: fc.Arbitrary<T>): fc.Arbitrary<T> =>
  arb.map((v) => {
    made.add(label())
    return v
  })
/** The route whose property is running: the labels name it. */
let routeName = ''

const broker = await startBroker(t, { HOOKQ_MAX_REQUEST_BYTES: '65536', HOOKQ_MAX_MESSAGE_BYTES: '16384' })
const app = broker.app

// Fixtures: "base" (never produced to) consumed by group "g"; "sink" and "other" take messages.
for (const [url, payload] of [
  ['/v1/topics/base', { partitions: 2 }],
  ['/v1/topics/other', { partitions: 1 }],
  ['/v1/topics/sink', { partitions: 2 }],
  ['/v1/groups/g', { topic: 'base' }],
] as const) {
  const res = await app.inject({ method: 'PUT', url, payload })
  if (res.statusCode !== 201) throw new Error(`${url}: ${res.body}`)
}
// A consumer on "g" whose id the secret-rotation route is fuzzed with (base has no messages: no pushes).
const fixtureConsumer = (
  await app.inject({ method: 'POST', url: '/v1/groups/g/consumers', payload: { url: 'http://127.0.0.1:9/fixture' } })
).json() as { id: string }

const TABLES = [
  'topics',
  'topic_partitions',
  'messages',
  'consumer_groups',
  'consumers',
  'group_offsets',
  'group_completions',
  'deliveries',
]
// The owner epoch is the broker's own bookkeeping (bumped whenever this process claims a partition,
// in the background after a group is created), not state a request changes.
const readTables = tableSnapshot(
  TABLES.map((table) =>
    table === 'group_offsets'
      ? [table, '(SELECT group_id, topic_id, partition, committed_offset, pushed_offset, seeked_at FROM group_offsets)']
      : table,
  ),
)
const snapshot = () => readTables(broker.db.pool)

// ---- generators ----
// Produce never targets "base" (the only topic groups may consume), so no push, attempt log or
// offset write ever happens in the background: every table change comes from the request itself.
const TOPIC_NAMES = ['sink', 'other', 'fz', 'fz.1', 'fz-2', 'a_b']
const GROUP_NAMES = ['g', 'fz', 'fz.1', 'fz-2', 'a_b']
const NAME_KINDS = ['good', 'pattern', 'string', 'binary', 'odd']
const name = (k: string) => () => `${routeName}: name ${k}`
const anyName = (good: string[]) =>
  fc
    .oneof(
      { weight: 4, arbitrary: kind(name('good'), fc.constantFrom(...good)) },
      { weight: 3, arbitrary: kind(name('pattern'), fc.stringMatching(/^[A-Za-z0-9._-]{1,20}$/)) },
      { weight: 2, arbitrary: kind(name('string'), fc.string({ maxLength: 30 })) },
      { weight: 1, arbitrary: kind(name('binary'), fc.string({ unit: 'binary', maxLength: 20 })) },
      {
        weight: 1,
        arbitrary: kind(
          name('odd'),
          fc.constantFrom('', ' ', 'a b', 'x'.repeat(249), 'x'.repeat(250), '%', 'é', '\u0000', '__proto__', 'constructor', 'null'),
        ),
      },
    )
    .filter((s) => s !== '.' && s !== '..' && s !== 'base') // dot segments are resolved by the URL parser: another route

/** Dates Date.parse takes but RFC 3339 does not, and ones PostgreSQL cannot store. */
const BAD_TIMES = [
  '-271821-04-20T00:00:00Z',
  '+275760-09-13T00:00:00Z',
  '2026',
  'Thu, 01 Jan 2026 00:00:00 GMT',
  '2016-12-31T23:59:60Z',
  '2026-02-30T00:00:00Z',
  '2026-01-01T00:00:00Z\u0000',
  '0000-01-01T00:00:00+01:00',
]
/** URLs RFC 3986 syntax (format: uri) passes and the WHATWG parser refuses. */
const ODD_URLS = [
  'http://example.com:65536/',
  'http://example.com:99999/',
  'http://example.com:-1/',
  'http://example.com:80:80/',
  'http://127.0.0.1%2F',
  'http://127.0.0.1%00.evil.com',
  'http://xn--localhost/',
  'http://[2002:a9fe:a9fe::]/',
  'http://255.255.255.255/',
]
/** Numerals Number() reads and plain decimal does not. */
const ODD_NUMERALS = ['0x10', '+1', '00', '01', ' 1', '1e0', '1.0', '0b1', '-0', '1\u0000']

/** JSON values, including the awkward ones. */
const weird = fc.constantFrom<unknown>(
  0,
  -0,
  -1,
  1.5,
  1e308,
  -1e308,
  2 ** 31,
  2 ** 53 + 2,
  Number.MAX_SAFE_INTEGER,
  Number.MIN_SAFE_INTEGER,
  9.999e20,
  'NaN',
  'Infinity',
  '-Infinity',
  '1e999',
  '',
  ' ',
  '0',
  '-1',
  'true',
  'null',
  '\u0000',
  'a\u0000b',
  '\uFFFF',
  '\uD800',
  'x'.repeat(5000),
  null,
  true,
  false,
  [],
  {},
  [null],
  { '': '' },
  { 'a\u0000': 'v' },
  { ['h'.repeat(257)]: 'v' },
  ...BAD_TIMES,
  ...ODD_URLS,
  ...ODD_NUMERALS,
)
/**
 * Deeply nested arrays or objects (JSON.parse copes; recursive code after it may not). Generated as
 * a placeholder string and expanded only in the serialised body, so neither fast-check nor
 * JSON.stringify in this process has to recurse through it.
 */
const deep = fc
  .tuple(fc.integer({ min: 100, max: 12_000 }), fc.boolean())
  .map(([depth, arrays]) => `\u0001deep:${depth}:${arrays ? 'arrays' : 'objects'}\u0001`)
const DEEP = /"\\u0001deep:(\d+):(arrays|objects)\\u0001"/g
function serialise(payload: unknown): string {
  return (JSON.stringify(payload) ?? 'null').replace(DEEP, (_, n: string, kind: string) =>
    kind === 'arrays' ? '['.repeat(Number(n)) + ']'.repeat(Number(n)) : `${'{"a":'.repeat(Number(n))}1${'}'.repeat(Number(n))}`,
  )
}
const JSON_KINDS = ['value', 'weird', 'deep']
const json = fc.oneof(
  { weight: 6, arbitrary: kind(() => 'json: value', fc.jsonValue({ maxDepth: 3 })) },
  { weight: 4, arbitrary: kind(() => 'json: weird', weird) },
  { weight: 1, arbitrary: kind(() => 'json: deep', deep) },
)

interface Route {
  name: string
  method: 'PUT' | 'POST'
  url: (p: string) => string
  valid: fc.Arbitrary<Record<string, unknown>>
  names?: string[]
}
const deliveryIds = fc.array(fc.string({ minLength: 1, maxLength: 40 }), { minLength: 1, maxLength: 5 })
const ROUTES: Route[] = [
  {
    name: 'PUT topic',
    method: 'PUT',
    url: (p) => `/v1/topics/${p}`,
    valid: fc.record(
      { partitions: fc.integer({ min: 1, max: 4 }), retentionMs: fc.integer({ min: 60_000, max: 10 ** 9 }) },
      { requiredKeys: ['partitions'] },
    ),
  },
  {
    name: 'POST messages',
    method: 'POST',
    url: (p) => `/v1/topics/${p}/messages`,
    valid: fc.record({
      messages: fc.array(
        fc.record(
          {
            value: fc.oneof({ weight: 9, arbitrary: fc.jsonValue({ maxDepth: 3 }) }, { weight: 1, arbitrary: deep }),
            key: fc.string({ maxLength: 20 }).filter((s) => !s.includes('\u0000')),
            headers: fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 3 }),
            partition: fc.integer({ min: 0, max: 1 }),
            delayMs: fc.integer({ min: 0, max: 10_000 }),
            idempotencyKey: fc.string({ minLength: 1, maxLength: 20 }).filter((s) => !s.includes('\u0000')),
          },
          { requiredKeys: ['value'] },
        ),
        { minLength: 1, maxLength: 5 },
      ),
    }),
  },
  {
    name: 'PUT group',
    method: 'PUT',
    url: (p) => `/v1/groups/${p}`,
    valid: fc.record(
      {
        topic: fc.constantFrom('base'),
        ackMode: fc.constantFrom('explicit', 'auto'),
        ackTimeoutMs: fc.integer({ min: 1000, max: 60_000 }),
        maxDeliveries: fc.integer({ min: 1, max: 10 }),
        retry: fc.record(
          {
            initialDelayMs: fc.integer({ min: 0, max: 5000 }),
            multiplier: fc.double({ min: 1, max: 4, noNaN: true }),
            maxDelayMs: fc.integer({ min: 1000, max: 60_000 }),
            jitter: fc.double({ min: 0, max: 1, noNaN: true }),
          },
          { requiredKeys: [] },
        ),
        deadLetterTopic: fc.constantFrom('other', null),
        startAt: fc.constantFrom('earliest', 'latest', '2026-01-01T00:00:00Z'),
        maxInFlight: fc.integer({ min: 1, max: 100 }),
        ordered: fc.boolean(),
        pushTimeoutMs: fc.integer({ min: 100, max: 10_000 }),
        pushFormat: fc.constantFrom('envelope', 'raw'),
        paused: fc.boolean(),
      },
      { requiredKeys: ['topic'] },
    ),
  },
  {
    name: 'POST consumers',
    method: 'POST',
    url: (p) => `/v1/groups/${p}/consumers`,
    // Port 9 (discard) refuses connections; base has no messages unless produce wrote some.
    valid: fc.record(
      {
        url: fc.constantFrom('http://127.0.0.1:9/a', 'https://127.0.0.1:9/b'),
        secret: fc.constant('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'),
      },
      { requiredKeys: ['url'] },
    ),
  },
  { name: 'POST acks', method: 'POST', url: (p) => `/v1/groups/${p}/acks`, valid: fc.record({ deliveryIds }) },
  {
    name: 'POST consumer secret',
    method: 'POST',
    url: (p) => `/v1/groups/g/consumers/${p}/secret`,
    names: [fixtureConsumer.id],
    valid: fc.record(
      { secret: fc.constant('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'), overlapMs: fc.integer({ min: 0, max: 86_400_000 }) },
      { requiredKeys: [] },
    ),
  },
  {
    name: 'POST nacks',
    method: 'POST',
    url: (p) => `/v1/groups/${p}/nacks`,
    valid: fc.record(
      { deliveryIds, delayMs: fc.integer({ min: 0, max: 10_000 }), deadLetter: fc.boolean() },
      { requiredKeys: ['deliveryIds'] },
    ),
  },
  {
    name: 'POST extend',
    method: 'POST',
    url: (p) => `/v1/groups/${p}/extend`,
    valid: fc.record({ deliveryIds, extendMs: fc.integer({ min: 1, max: 60_000 }) }),
  },
  {
    name: 'POST seek',
    method: 'POST',
    url: (p) => `/v1/groups/${p}/seek`,
    valid: fc.oneof(
      fc.record({ partition: fc.integer({ min: 0, max: 1 }), offset: fc.constant(0) }, { requiredKeys: ['offset'] }),
      fc.record({ timestamp: fc.constantFrom('2026-01-01T00:00:00Z', '1970-01-01T00:00:00.000Z') }),
    ),
  },
]

/** The body with a NUL put into one of its strings (at any depth, keys of objects included). */
function withNul(body: Record<string, unknown>, i: number): Record<string, unknown> {
  const paths: { parent: Record<string, unknown> | unknown[]; key: string | number; isKey: boolean }[] = []
  const walk = (node: unknown) => {
    if (Array.isArray(node))
      node.forEach((v, k) => {
        if (typeof v === 'string') paths.push({ parent: node, key: k, isKey: false })
        else walk(v)
      })
    else if (node && typeof node === 'object') {
      for (const [k, v] of Object.entries(node)) {
        if (typeof v === 'string') paths.push({ parent: node as Record<string, unknown>, key: k, isKey: false })
        else walk(v)
        if (node !== body) paths.push({ parent: node as Record<string, unknown>, key: k, isKey: true })
      }
    }
  }
  walk(body)
  const at = paths[i % Math.max(1, paths.length)]
  if (!at) return { ...body, extra: '\u0000' }
  const p = at.parent as Record<string | number, unknown>
  if (at.isKey) {
    p[`${String(at.key)}\u0000`] = p[at.key]
    delete p[at.key]
  } else {
    const text = p[at.key] as string
    const cut = i % (text.length + 1)
    p[at.key] = `${text.slice(0, cut)}\u0000${text.slice(cut)}`
  }
  return body
}

const MUTATIONS = ['drop', 'add', 'retype', 'retype-nested', 'huge-string', 'nul'] as const
/** A mutation of a valid body: drop a field, add one, replace a field (or a nested one) by anything, or put NUL in a string. */
function mutated(valid: fc.Arbitrary<Record<string, unknown>>): fc.Arbitrary<unknown> {
  return fc
    .tuple(valid, fc.nat(), fc.constantFrom(...MUTATIONS), json, fc.string({ maxLength: 12 }))
    .map(([body, i, op, replacement, field]) => {
      made.add(`${routeName}: body mutated ${op}`)
      const out = structuredClone(body) as Record<string, unknown>
      const keys = Object.keys(out)
      const key = keys.length ? keys[i % keys.length]! : 'x'
      switch (op) {
        case 'drop':
          delete out[key]
          break
        case 'add':
          out[field === '__proto__' ? 'proto' : field || 'extra'] = replacement
          break
        case 'retype':
          out[key] = replacement
          break
        case 'retype-nested': {
          const inner = out[key]
          const target = Array.isArray(inner) ? inner[0] : inner
          if (target && typeof target === 'object') {
            const innerKeys = Object.keys(target)
            if (innerKeys.length) (target as Record<string, unknown>)[innerKeys[i % innerKeys.length]!] = replacement
            else (target as Record<string, unknown>).extra = replacement
          } else out[key] = replacement
          break
        }
        case 'huge-string':
          out[key] = 'z'.repeat(1000 + (i % 20_000))
          break
        case 'nul':
          return withNul(out, i)
      }
      return out
    })
}

const BODY_KINDS = ['valid', ...MUTATIONS.map((op) => `mutated ${op}`), 'json', 'dictionary']
const body = (route: Route) =>
  fc.oneof(
    { weight: 2, arbitrary: kind(() => `${route.name}: body valid`, route.valid) },
    { weight: 5, arbitrary: mutated(route.valid) },
    { weight: 2, arbitrary: kind(() => `${route.name}: body json`, json) },
    {
      weight: 1,
      arbitrary: kind(() => `${route.name}: body dictionary`, fc.dictionary(fc.string({ maxLength: 10 }), json, { maxKeys: 4 })),
    },
  )

type Res = { statusCode: number; headers: Record<string, unknown>; body: string }
function problemFailure(res: Res): string | undefined {
  if (!/^application\/problem\+json/.test(String(res.headers['content-type']))) return `content-type ${String(res.headers['content-type'])}`
  let doc: Record<string, unknown>
  try {
    doc = JSON.parse(res.body)
  } catch {
    return 'body is not JSON'
  }
  for (const k of ['type', 'title', 'detail', 'code']) if (typeof doc[k] !== 'string') return `${k} is not a string`
  if (doc.status !== res.statusCode) return `status member ${String(doc.status)} ≠ ${res.statusCode}`
  return undefined
}

const started = Date.now()
let current = await snapshot()
const tally: Record<string, Record<string, number>> = {}

for (const route of ROUTES) {
  t.test(`${route.name}: no 5xx, 4xx are problem documents and change nothing`, async (t) => {
    const seen: Record<string, number> = (tally[route.name] = {})
    routeName = route.name
    const property = fc.asyncProperty(
      anyName(route.names ?? (route.url('x').startsWith('/v1/topics') ? TOPIC_NAMES : GROUP_NAMES)),
      body(route),
      async (name, payload) => {
        const res = await app.inject({
          method: route.method,
          url: route.url(encodeURIComponent(name)),
          headers: { 'content-type': 'application/json' },
          payload: serialise(payload),
        })
        seen[res.statusCode] = (seen[res.statusCode] ?? 0) + 1
        const request = `${route.method} ${route.url(encodeURIComponent(name))} ${JSON.stringify(payload)?.slice(0, 400)}`
        if (res.statusCode >= 500) throw new Error(`5xx: ${request} → ${res.statusCode} ${res.body.slice(0, 300)}`)
        const after = await snapshot()
        if (res.statusCode >= 400) {
          const bad = problemFailure(res)
          if (bad) throw new Error(`4xx not a problem document (${bad}): ${request} → ${res.statusCode} ${res.body.slice(0, 300)}`)
          const changed = TABLES.filter((tb) => after[tb] !== current[tb])
          if (changed.length) {
            current = after
            throw new Error(`a ${res.statusCode} changed ${changed.join(', ')}: ${request} → ${res.body.slice(0, 300)}`)
          }
        }
        current = after
      },
    )
    const details = await fc.check(property, { seed: SEED, numRuns: RUNS, endOnFailure: true })
    if (details.failed) {
      t.comment(`fast-check seed ${SEED} (HOOKQ_FUZZ_SEED=${SEED} HOOKQ_FUZZ_RUNS=${RUNS} to replay), path ${details.counterexamplePath}`)
      t.comment(String((details.errorInstance as Error | undefined)?.message ?? details.errorInstance).slice(0, 600))
      t.fail(fc.defaultReportMessage(details) ?? 'property failed')
    } else {
      t.pass(`${details.numRuns} runs, seed ${SEED}`)
    }
    t.comment(`${route.name} statuses: ${JSON.stringify(seen)}`)
  })
}

t.test('paths and queries: numerals, NUL and odd text; plain decimal or a 400, never a 5xx or a change', async (t) => {
  const segment = fc.oneof(
    { weight: 3, arbitrary: fc.constantFrom(...ODD_NUMERALS, '\u0000', 'a\u0000b') },
    { weight: 2, arbitrary: fc.integer({ min: -2, max: 3 }).map(String) },
    { weight: 2, arbitrary: fc.string({ maxLength: 12 }) },
  )
  const before = await snapshot()
  const seen: Record<string, number> = {}
  const property = fc.asyncProperty(fc.constantFrom('fetch', 'deliveries', 'delete consumer'), segment, segment, async (kind, a, b) => {
    const url =
      kind === 'fetch'
        ? `/v1/topics/sink/partitions/${encodeURIComponent(a)}/messages?fromOffset=${encodeURIComponent(b)}`
        : kind === 'deliveries'
          ? `/v1/groups/g/deliveries?partition=${encodeURIComponent(a)}&offset=${encodeURIComponent(b)}`
          : `/v1/groups/g/consumers/${encodeURIComponent(a)}${b}` // never the fixture's id, so never a 204
    const res = await app.inject({ method: kind === 'delete consumer' ? 'DELETE' : 'GET', url })
    seen[res.statusCode] = (seen[res.statusCode] ?? 0) + 1
    if (res.statusCode >= 500) throw new Error(`5xx: ${url} → ${res.statusCode} ${res.body.slice(0, 300)}`)
    if (res.statusCode >= 400) {
      const bad = problemFailure(res)
      if (bad) throw new Error(`4xx not a problem document (${bad}): ${url} → ${res.body.slice(0, 300)}`)
    }
    const decimal = (x: string) => /^(0|[1-9][0-9]*)$/.test(x)
    if (kind !== 'delete consumer' && (!decimal(a) || !decimal(b)) && res.statusCode !== 400) {
      throw new Error(`a number not in plain decimal was taken: ${url} → ${res.statusCode}`)
    }
  })
  const details = await fc.check(property, { seed: SEED, numRuns: RUNS, endOnFailure: true })
  if (details.failed) t.fail(fc.defaultReportMessage(details) ?? 'property failed')
  else t.pass(`${details.numRuns} runs, seed ${SEED}`)
  t.same(await snapshot(), before, 'reads and refused deletes changed nothing')
  t.comment(`paths and queries statuses: ${JSON.stringify(seen)}`)
})

t.test('every kind of case came up: each way of making a name and a body, each mutation, each kind of JSON', async (t) => {
  const expected = [
    ...ROUTES.flatMap((r) => [...NAME_KINDS.map((k) => `${r.name}: name ${k}`), ...BODY_KINDS.map((k) => `${r.name}: body ${k}`)]),
    ...JSON_KINDS.map((k) => `json: ${k}`),
  ]
  const missing = expected.filter((k) => !made.has(k))
  t.same(
    missing,
    [],
    `all ${expected.length} kinds of case made in ${RUNS} runs a route${missing.length ? ' (too few: raise HOOKQ_FUZZ_RUNS)' : ''}`,
  )
})

t.test('the broker still answers after the fuzzing', async (t) => {
  t.equal((await app.inject({ url: '/healthz' })).statusCode, 200)
  t.equal(({} as Record<string, unknown>).polluted, undefined)
  t.comment(`fuzzing took ${Date.now() - started} ms (seed ${SEED}, ${RUNS} runs a route)`)
  // Loose: 8 s in CI, 25 s with the machine loaded; a pathological input would take minutes.
  t.ok(Date.now() - started < 100_000, 'bounded: under 100 s')
})

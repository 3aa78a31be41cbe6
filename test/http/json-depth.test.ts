/**
 * JSON bodies nested past the limit are refused by a scan before JSON.parse builds them (issue 13,
 * item 7): a 400 naming the limit, for a body that would otherwise cost seconds of event loop.
 */
import t from '../helpers/tap.ts'
import { gzipSync } from 'node:zlib'
import { request } from 'undici'
import {
  MAX_BODY_DEPTH,
  MAX_BODY_MEMBERS,
  MAX_OBJECT_MEMBERS,
  MAX_VALUE_DEPTH,
  nestsDeeperThan,
  scanJsonShape,
} from '../../src/http/json-body.ts'
import { MAX_MESSAGE_HEADERS } from '../../src/http/schemas/messages.ts'
import { startListeningBroker } from '../helpers/broker.ts'

const { broker, url } = await startListeningBroker(t)
const app = broker.app
const json = { 'content-type': 'application/json' }
const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth)
const produceBody = (valueText: string) => `{"messages":[{"value":${valueText},"key":"k"}]}`
const NESTING = new RegExp(`nested too deeply: more than ${MAX_BODY_DEPTH} levels`)

t.before(async () => {
  const res = await app.inject({ method: 'PUT', url: '/v1/topics/deep', payload: { partitions: 1 } })
  if (res.statusCode !== 201) throw new Error(res.body)
})

t.test('the scan counts brackets outside strings only', async (t) => {
  t.equal(nestsDeeperThan('1', 0), false)
  t.equal(nestsDeeperThan('[]', 0), true)
  t.equal(nestsDeeperThan('[{"a":[1]}]', 3), false)
  t.equal(nestsDeeperThan('[{"a":[1]}]', 2), true)
  t.equal(nestsDeeperThan('[[],[],[]]', 2), false, 'siblings do not add up')
  t.equal(nestsDeeperThan('["[[[[{{{{"]', 1), false, 'brackets in a string')
  t.equal(nestsDeeperThan('["a\\"[[[[", "{{"]', 1), false, 'an escaped quote does not end the string')
  t.equal(nestsDeeperThan('["a\\\\", [[1]]]', 2), true, 'an escaped backslash before a quote does end it')
  t.equal(nestsDeeperThan('["a\\\\\\"[[", 1]', 1), false, 'three backslashes: the quote is escaped')
  t.equal(nestsDeeperThan('{"k[":"v{","[":[[1]]}', 3), false)
  t.equal(nestsDeeperThan('{"k[":"v{","[":[[1]]}', 2), true)
})

t.test('a body nested past the limit is a 400 naming it, refused before JSON.parse', async (t) => {
  const deep = await app.inject({ method: 'POST', url: '/v1/topics/deep/messages', headers: json, payload: produceBody(nested(200_000)) })
  t.equal(deep.statusCode, 400)
  t.match(deep.json(), { code: 'invalid_request', status: 400, detail: NESTING })
  t.match(deep.headers['content-type'], /^application\/problem\+json/)

  // Never closed, so not JSON at all: refused for its depth, which only a scan before parsing sees.
  const unclosed = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: `{"messages":[{"value":${'['.repeat(200_000)}`,
  })
  t.equal(unclosed.statusCode, 400)
  t.match(unclosed.json(), { code: 'invalid_request', detail: NESTING })

  // Any route, any place in the body.
  const topic = await app.inject({
    method: 'PUT',
    url: '/v1/topics/other',
    headers: json,
    payload: `{"partitions":1,"x":${nested(MAX_BODY_DEPTH + 1)}}`,
  })
  t.equal(topic.statusCode, 400)
  t.match(topic.json(), { code: 'invalid_request', detail: NESTING })

  // Compressed bodies are scanned once inflated.
  const gz = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: { ...json, 'content-encoding': 'gzip' },
    payload: gzipSync(produceBody(nested(200_000))),
  })
  t.equal(gz.statusCode, 400)
  t.match(gz.json(), { code: 'invalid_request', detail: NESTING })
})

t.test(`a message value may nest ${MAX_VALUE_DEPTH} levels, not one more`, async (t) => {
  const ok = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: produceBody(nested(MAX_VALUE_DEPTH)),
  })
  t.equal(ok.statusCode, 201, ok.body)
  const offset = ok.json().results[0].offset as number
  const read = await app.inject({ url: `/v1/topics/deep/partitions/0/messages?fromOffset=${offset}&limit=1` })
  t.equal(JSON.stringify(read.json().messages[0].value), nested(MAX_VALUE_DEPTH), 'comes back as sent')

  const over = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: produceBody(nested(MAX_VALUE_DEPTH + 1)),
  })
  t.equal(over.statusCode, 400)
  t.match(over.json(), { code: 'invalid_request', detail: NESTING })
})

t.test('brackets and escaped quotes inside strings do not count', async (t) => {
  const tricky = [`${'['.repeat(5000)}"${'{'.repeat(5000)}`, 'ends in a backslash \\', '\\"[[[', '\u0000[']
  // The strings sit in the innermost array of a value as deep as allowed: one bracket of theirs
  // counted would refuse the body.
  const value = JSON.parse(nested(MAX_VALUE_DEPTH)) as unknown[]
  let inner = value
  while (inner.length > 0) inner = inner[0] as unknown[]
  inner.push(...tricky)
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: JSON.stringify({ messages: [{ value, key: '[[[{{{', headers: { '[{': '"]}' } }] }),
  })
  t.equal(res.statusCode, 201, res.body.slice(0, 300))
  const read = await app.inject({ url: `/v1/topics/deep/partitions/0/messages?fromOffset=${res.json().results[0].offset}&limit=1` })
  t.strictSame(read.json().messages[0].value, value)
})

const wide = (members: number, from = 0) => `{${Array.from({ length: members }, (_, i) => `"k${from + i}":1`).join(',')}}`

t.test('the scan counts members per object and in all, outside strings only', async (t) => {
  const limits = { maxDepth: 10, maxObjectMembers: 2, maxBodyMembers: 4 }
  t.equal(scanJsonShape('{"a":1,"b":{"c":1,"d":2}}', limits), undefined, 'members of nested objects count apart')
  t.equal(scanJsonShape('{"a":1,"b":2,"c":3}', limits), 'object_members')
  t.equal(scanJsonShape('[{"a":1,"b":2},{"a":1,"b":2},{"a":1}]', limits), 'body_members')
  t.equal(scanJsonShape('[{"a":1,"b":2},{"a":1,"b":2}]', limits), undefined)
  t.equal(scanJsonShape('{"a":"x:y:z:w:v","b:c:d":1}', limits), undefined, 'colons in strings')
  t.equal(scanJsonShape('{"a":{"b":1,"c":1},"d":1}', limits), undefined, 'a closed object does not lend its members to its parent')
})

t.test(`an object of more than ${MAX_OBJECT_MEMBERS} members is a 400, refused before JSON.parse`, async (t) => {
  const ok = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: produceBody(wide(MAX_OBJECT_MEMBERS)),
  })
  t.equal(ok.statusCode, 201, ok.body.slice(0, 300))
  const over = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: produceBody(wide(MAX_OBJECT_MEMBERS + 1)),
  })
  t.equal(over.statusCode, 400)
  t.match(over.json(), { code: 'invalid_request', detail: `an object in the body has more than ${MAX_OBJECT_MEMBERS} members` })
  // The body: 850k keys in one value, never closed, so not JSON at all; only a scan before
  // parsing can refuse it for its width (JSON.parse would call it malformed, after building it).
  const huge = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: `{"messages":[{"value":${wide(850_000).slice(0, -1)}`,
  })
  t.equal(huge.statusCode, 400)
  t.match(huge.json(), { code: 'invalid_request', detail: /more than 10000 members/ })
})

t.test(`a body of more than ${MAX_BODY_MEMBERS} object members in all is a 413, refused before JSON.parse`, async (t) => {
  const per = MAX_OBJECT_MEMBERS
  const values = (n: number) => Array.from({ length: n }, (_, i) => `{"value":${wide(per, i * per)}}`)
  // Each message has one member (value) besides its value's; the body object one (messages).
  const fits = Math.floor((MAX_BODY_MEMBERS - 1) / (per + 1))
  const ok = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: `{"messages":[${values(fits).join(',')}]}`,
  })
  t.equal(ok.statusCode, 201, ok.body.slice(0, 300))
  const over = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: `{"messages":[${values(fits + 1).join(',')}`, // unclosed: only the scan can tell
  })
  t.equal(over.statusCode, 413)
  t.match(over.json(), {
    code: 'body_too_large',
    detail: `the body holds more than ${MAX_BODY_MEMBERS} object members in all; send its messages in smaller calls`,
  })
})

t.test(`a message of more than ${MAX_MESSAGE_HEADERS} headers is a 400, and nothing is stored`, async (t) => {
  const headers = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`h${i}`, 'v']))
  const ok = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    payload: { messages: [{ value: 1, headers: headers(MAX_MESSAGE_HEADERS) }] },
  })
  t.equal(ok.statusCode, 201, ok.body)
  const offset = ok.json().results[0].offset as number
  const over = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    payload: { messages: [{ value: 2 }, { value: 3, headers: headers(MAX_MESSAGE_HEADERS + 1) }] },
  })
  t.equal(over.statusCode, 400)
  t.match(over.json(), {
    code: 'invalid_request',
    errors: [{ path: 'body/messages/1/headers', message: `must NOT have more than ${MAX_MESSAGE_HEADERS} properties` }],
  })
  const read = await app.inject({ url: `/v1/topics/deep/partitions/0/messages?fromOffset=${offset + 1}` })
  t.equal(read.json().messages.length, 0, 'nothing of the refused call was stored')
})

t.test('what the JSON parser refused before, it still refuses (and keys named __proto__ by what the schema names)', async (t) => {
  const cases: [string, Record<string, string>, string | Buffer, number, string][] = [
    // Valid JSON, parsed as it is; the topic schema names no such member.
    ['__proto__ key', json, '{"partitions":1,"__proto__":{"x":1}}', 400, 'invalid_request'],
    ['constructor.prototype key', json, '{"partitions":1,"constructor":{"prototype":{"x":1}}}', 400, 'invalid_request'],
    ['malformed', json, '{"partitions":', 400, 'invalid_json'],
    ['empty', json, '', 400, 'invalid_json'],
    ['text/plain', { 'content-type': 'text/plain' }, '{"partitions":1}', 415, 'unsupported_media_type'],
  ]
  for (const [what, headers, payload, status, code] of cases) {
    const res = await app.inject({ method: 'PUT', url: '/v1/topics/refused', headers, payload })
    t.equal(res.statusCode, status, what)
    t.equal(res.json().code, code, what)
  }
  const gz = await app.inject({
    method: 'PUT',
    url: '/v1/topics/zipped',
    headers: { ...json, 'content-encoding': 'gzip' },
    payload: gzipSync('{"partitions":2}'),
  })
  t.equal(gz.statusCode, 201, 'a gzip body still parses')
  t.equal(gz.json().partitions, 2)
  t.equal((await app.inject({ url: '/v1/topics/refused' })).statusCode, 404, 'nothing was created')
})

t.test('a message with __proto__ and constructor.prototype keys is stored and comes back as sent', async (t) => {
  const valueText = '{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}},"a":[{"__proto__":null}]}'
  const headersText = '{"__proto__":"v","h":"w"}'
  const res = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: `{"messages":[{"value":${valueText},"headers":${headersText}}]}`,
  })
  t.equal(res.statusCode, 201, res.body)
  const read = await app.inject({ url: `/v1/topics/deep/partitions/0/messages?fromOffset=${res.json().results[0].offset}&limit=1` })
  const text = read.body
  t.ok(text.includes(`"value":${valueText}`), 'the value comes back as sent, its __proto__ key included')
  t.ok(text.includes(`"headers":${headersText}`), 'and its headers')
  t.equal(({} as { polluted?: unknown }).polluted, undefined, 'no prototype was touched')
  const message = JSON.parse(text).messages[0]
  t.ok(Object.hasOwn(message.value, '__proto__'), 'an own member once parsed')

  const extra = await app.inject({
    method: 'POST',
    url: '/v1/topics/deep/messages',
    headers: json,
    payload: '{"messages":[{"value":1,"__proto__":{"key":"k"}}]}',
  })
  t.equal(extra.statusCode, 400, 'a __proto__ member where the schema names none is refused by name')
  t.match(extra.json(), {
    code: 'invalid_request',
    errors: [{ path: 'body/messages/0', message: 'must NOT have additional properties: "__proto__"' }],
  })
})

t.test('/healthz answers while three 8 MB nested bodies are in flight', async (t) => {
  const body = Buffer.from(produceBody(nested(4_000_000)))
  const deep = Array.from({ length: 3 }, () =>
    request(`${url}/v1/topics/deep/messages`, { method: 'POST', headers: json, body }).then(async (res) => ({
      status: res.statusCode,
      problem: (await res.body.json()) as { code: string; detail: string },
    })),
  )
  const health = await request(`${url}/healthz`)
  t.equal(health.statusCode, 200)
  await health.body.dump()
  for (const res of await Promise.all(deep)) {
    t.equal(res.status, 400)
    t.match(res.problem, { code: 'invalid_request', detail: NESTING })
  }
})

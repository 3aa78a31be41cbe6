/**
 * The push URL policy end to end: registration through the HTTP API refuses denied URLs, and push()
 * refuses denied addresses at connect time. No real DNS: names resolve through a fake lookup, and
 * every connection that does happen goes to 127.0.0.1.
 */
import t from '../helpers/tap.ts'
import type { LookupAddress } from 'node:dns'
import type { LookupFunction } from 'node:net'
import { createPushAgent, push, type PushRequest } from '../../src/dispatch/pusher.ts'
import { DEFAULT_POLICY, parsePolicy } from '../../src/security/url-policy.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'

const request = (url: string): PushRequest => ({ url, body: '{"n":1}', headers: { 'content-type': 'application/json' }, timeoutMs: 2_000 })

/** A resolver from a fixed table; unknown names fail like NXDOMAIN. Records every name asked. */
function fakeLookup(table: Record<string, string[]>, asked: string[]): LookupFunction {
  return ((hostname: string, options: { all?: boolean }, callback: (...args: unknown[]) => void) => {
    asked.push(hostname)
    const addresses = table[hostname]
    setImmediate(() => {
      if (!addresses) return callback(Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' }))
      const answers: LookupAddress[] = addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }))
      if (options.all) callback(null, answers)
      else callback(null, answers[0]!.address, answers[0]!.family)
    })
  }) as LookupFunction
}

t.test('registration: a broker with HOOKQ_PUSH_ALLOW_PRIVATE=false refuses internal URLs', async (t) => {
  const broker = await startBroker(t, { HOOKQ_PUSH_ALLOW_PRIVATE: 'false' })
  const json = (method: 'PUT' | 'POST' | 'GET', url: string, payload?: object) =>
    broker.app.inject({ method, url, ...(payload ? { payload } : {}) })
  t.equal((await json('PUT', '/v1/topics/orders', { partitions: 1 })).statusCode, 201)
  t.equal((await json('PUT', '/v1/groups/billing', { topic: 'orders' })).statusCode, 201)

  for (const [url, reason] of [
    ['http://127.0.0.1:8080/hook', /address 127\.0\.0\.1 is denied by the push URL policy: it is private or loopback/],
    ['http://[::ffff:127.0.0.1]/', /address ::ffff:7f00:1 \(127\.0\.0\.1\) is denied/],
    ['http://0x7f000001/', /address 127\.0\.0\.1 is denied/],
    ['http://2130706433/', /address 127\.0\.0\.1 is denied/],
    ['http://localhost:3000/', /host localhost is loopback/],
    [
      'http://169.254.169.254/latest/meta-data/',
      /address 169\.254\.169\.254 is denied by the push URL policy: it is a cloud metadata address/,
    ],
    ['http://metadata.google.internal/', /cloud metadata service/],
    ['http://10.0.0.1/', /private or loopback/],
    ['http://[2002:7f00:1::]/', /address 2002:7f00:1:: \(127\.0\.0\.1\) is denied/],
    ['http://198.18.0.1/', /private or loopback/],
    ['http://255.255.255.255/', /reserved or broadcast/],
    ['http://[2001:db8::1]/', /documentation range/],
  ] as const) {
    const res = await json('POST', '/v1/groups/billing/consumers', { url })
    t.equal(res.statusCode, 400, url)
    t.match(res.json(), { type: 'urn:hookq:problem:url_not_allowed', code: 'url_not_allowed', status: 400, detail: reason }, url)
  }
  t.same((await json('GET', '/v1/groups/billing/consumers')).json().consumers, [], 'nothing was registered')
  // Names are not resolved at registration (nothing is produced, so nothing is ever pushed here).
  const ok = await json('POST', '/v1/groups/billing/consumers', { url: 'https://hooks.example.invalid/orders' })
  t.equal(ok.statusCode, 201, 'a name passes registration; its addresses are checked at connect time')
})

t.test('registration: metadata is refused even with the default (private allowed) policy', async (t) => {
  const broker = await startBroker(t)
  await broker.app.inject({ method: 'PUT', url: '/v1/topics/t', payload: { partitions: 1 } })
  await broker.app.inject({ method: 'PUT', url: '/v1/groups/g', payload: { topic: 't' } })
  for (const url of [
    'http://169.254.169.254/',
    'http://0251.0376.0251.0376/',
    'http://[fd00:ec2::254]/',
    'http://0.0.0.0:9/',
    'http://224.0.0.1/',
    'http://240.0.0.1/',
    'http://192.0.0.8/',
    'http://192.0.2.1/',
    'http://[100::1]/',
    'http://[2002:a9fe:a9fe::]/',
  ]) {
    const res = await broker.app.inject({ method: 'POST', url: '/v1/groups/g/consumers', payload: { url } })
    t.equal(res.json().code, 'url_not_allowed', url)
  }
  const local = await broker.app.inject({ method: 'POST', url: '/v1/groups/g/consumers', payload: { url: 'http://127.0.0.1:9/hook' } })
  t.equal(local.statusCode, 201, 'loopback is fine by default (quickstart, tests)')
})

t.test('connect time: a name resolving to a denied address is refused, with no connection made', async (t) => {
  const receiver = await startReceiver(t, { status: 200, body: 'ok' })
  const port = new URL(receiver.url).port
  const asked: string[] = []
  const lookup = fakeLookup(
    {
      'metadata.rebind.test': ['169.254.169.254'],
      'mapped.rebind.test': ['::ffff:169.254.169.254'],
      'loopback.rebind.test': ['127.0.0.1'],
      'mixed.rebind.test': ['127.0.0.1', '169.254.169.254'],
      'sixtofour-loopback.rebind.test': ['2002:7f00:1::'],
      'sixtofour-metadata.rebind.test': ['2002:a9fe:a9fe::'],
      'nat64-local.rebind.test': ['64:ff9b:1::a9fe:a9fe'],
      'translated.rebind.test': ['::ffff:0:7f00:1'],
      'multicast.rebind.test': ['224.0.0.1'],
      'broadcast.rebind.test': ['255.255.255.255'],
      'reserved.rebind.test': ['240.0.0.1'],
      'docs.rebind.test': ['2001:db8::1'],
      'bench.rebind.test': ['198.18.0.1'],
    },
    asked,
  )

  const open = createPushAgent({ policy: DEFAULT_POLICY, lookup })
  const strict = createPushAgent({ policy: parsePolicy({ HOOKQ_PUSH_ALLOW_PRIVATE: 'false' }), lookup })
  t.teardown(() => Promise.all([open.destroy(), strict.destroy()]))

  const delivered = await push(open, request(`http://loopback.rebind.test:${port}/hook`))
  t.match(delivered, { kind: 'delivered', status: 200, body: 'ok' }, 'an allowed resolved address connects')
  t.equal(receiver.requests.length, 1)

  const meta = await push(open, request(`http://metadata.rebind.test:${port}/latest/meta-data/`))
  t.match(meta, {
    kind: 'network',
    error:
      /ERR_PUSH_URL_POLICY address 169\.254\.169\.254 is denied by the push URL policy: it is a cloud metadata address \(host metadata\.rebind\.test\)/,
  })
  t.match(await push(open, request(`http://mapped.rebind.test:${port}/`)), {
    kind: 'network',
    error: /169\.254\.169\.254\) is denied by the push URL policy/,
  })
  t.match(
    await push(open, request(`http://mixed.rebind.test:${port}/`)),
    { kind: 'network', error: /address 169\.254\.169\.254 is denied/ },
    'one denied address among several fails the connect',
  )
  t.match(await push(strict, request(`http://loopback.rebind.test:${port}/`)), {
    kind: 'network',
    error: /address 127\.0\.0\.1 is denied by the push URL policy: it is private or loopback/,
  })
  t.match(
    await push(open, request(`http://nxdomain.rebind.test:${port}/`)),
    { kind: 'network', error: /ENOTFOUND/ },
    'lookup errors pass through',
  )
  // Special-purpose ranges and embedded IPv4 forms, as DNS might answer them.
  for (const [name, policy, reason] of [
    [
      'sixtofour-loopback.rebind.test',
      strict,
      /address 2002:7f00:1:: \(127\.0\.0\.1\) is denied by the push URL policy: it is private or loopback/,
    ],
    [
      'sixtofour-metadata.rebind.test',
      open,
      /2002:a9fe:a9fe:: \(169\.254\.169\.254\) is denied by the push URL policy: it is a cloud metadata address/,
    ],
    ['nat64-local.rebind.test', open, /64:ff9b:1::a9fe:a9fe \(169\.254\.169\.254\) is denied/],
    ['translated.rebind.test', strict, /::ffff:0:7f00:1 \(127\.0\.0\.1\) is denied/],
    ['multicast.rebind.test', open, /address 224\.0\.0\.1 is denied by the push URL policy: it is multicast/],
    ['broadcast.rebind.test', open, /address 255\.255\.255\.255 is denied by the push URL policy: it is reserved or broadcast/],
    ['reserved.rebind.test', open, /address 240\.0\.0\.1 is denied/],
    ['docs.rebind.test', open, /address 2001:db8::1 is denied by the push URL policy: it is a documentation range/],
    ['bench.rebind.test', strict, /address 198\.18\.0\.1 is denied by the push URL policy: it is private or loopback/],
  ] as const) {
    t.match(await push(policy, request(`http://${name}:${port}/`)), { kind: 'network', error: reason }, name)
  }
  t.equal(receiver.requests.length, 1, 'no denied push reached the receiver')
  t.ok(asked.includes('metadata.rebind.test') && asked.includes('loopback.rebind.test'), 'the injected lookup answered, not DNS')
})

t.test('push time: IP literals, which never reach lookup, are checked by push()', async (t) => {
  const receiver = await startReceiver(t, { status: 200 })
  const port = new URL(receiver.url).port
  const asked: string[] = []
  const strict = createPushAgent({ policy: parsePolicy({ HOOKQ_PUSH_ALLOW_PRIVATE: 'false' }), lookup: fakeLookup({}, asked) })
  const open = createPushAgent({ policy: DEFAULT_POLICY, lookup: fakeLookup({}, asked) })
  t.teardown(() => Promise.all([strict.destroy(), open.destroy()]))
  for (const url of [
    `http://127.0.0.1:${port}/`,
    `http://0x7f000001:${port}/`,
    `http://127.1:${port}/`,
    `http://[::ffff:127.0.0.1]:${port}/`,
  ]) {
    t.match(
      await push(strict, request(url)),
      { kind: 'network', error: /^ERR_PUSH_URL_POLICY address .*127\.0\.0\.1.* is denied by the push URL policy/ },
      url,
    )
  }
  t.match(await push(open, request(`http://169.254.169.254:${port}/`)), { kind: 'network', error: /cloud metadata address/ })
  t.match(await push(open, request(`http://127.0.0.1:${port}/`)), { kind: 'delivered' }, 'the default policy pushes to loopback')
  // Verdicts are cached per agent and URL: a second push gets the same one, and one agent's
  // verdict is never another's.
  t.match(
    await push(strict, request(`http://127.0.0.1:${port}/`)),
    { kind: 'network', error: /ERR_PUSH_URL_POLICY/ },
    'still denied the second time',
  )
  t.match(
    await push(open, request(`http://169.254.169.254:${port}/`)),
    { kind: 'network', error: /cloud metadata address/ },
    'metadata still denied',
  )
  t.match(await push(open, request(`http://127.0.0.1:${port}/`)), { kind: 'delivered' }, 'still delivered the second time')
  t.equal(receiver.requests.length, 2)
  t.same(asked, [], 'no lookup for literals')
})

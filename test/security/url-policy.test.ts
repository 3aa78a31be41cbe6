import t from '../helpers/tap.ts'
import { ConfigError, loadConfig } from '../../src/config.ts'
import { checkAddress, checkUrl, DEFAULT_POLICY, parsePolicy, type UrlPolicy } from '../../src/security/url-policy.ts'

const strict = parsePolicy({ HOOKQ_PUSH_ALLOW_PRIVATE: 'false' })
const policy = (env: Record<string, string>) => parsePolicy(env)
const reasonOf = (v: ReturnType<typeof checkUrl>) => (v.allowed ? '' : v.reason)

t.test('defaults: http on, private on, no lists', async (t) => {
  t.same(parsePolicy({}), DEFAULT_POLICY)
  t.same(loadConfig({}).pushPolicy, DEFAULT_POLICY, 'loadConfig threads it')
  t.same(checkUrl('http://127.0.0.1:9/hook', DEFAULT_POLICY), { allowed: true }, 'local development pushes to loopback')
  t.same(checkUrl('http://localhost:3000/', DEFAULT_POLICY), { allowed: true })
  t.same(checkUrl('https://hooks.example.com/x', strict), { allowed: true })
  t.same(checkUrl('http://8.8.8.8/', strict), { allowed: true }, 'a public IP literal')
  t.same(checkUrl('http://[2606:4700:4700::1111]/', strict), { allowed: true }, 'a public IPv6 literal')
})

const LOOPBACK_SPELLINGS = [
  'http://127.0.0.1/',
  'http://127.0.0.1:8080/x',
  'http://2130706433/',
  'http://0x7f000001/',
  'http://0x7F.0.0.1/',
  'http://0177.0.0.1/',
  'http://0177.0000.0000.0001/',
  'http://127.1/',
  'http://127.0.1/',
  'http://127.0.0.1./',
  'http://%31%32%37.0.0.1/',
  'http://１２７.０.０.１/',
  'http://127.255.255.254/',
  'http://[::1]/',
  'http://[0:0:0:0:0:0:0:1]/',
  'http://[::ffff:127.0.0.1]/',
  'http://[::ffff:7f00:1]/',
  'http://[0:0:0:0:0:ffff:127.0.0.1]/',
  'http://[::127.0.0.1]/',
  'http://[64:ff9b::127.0.0.1]/',
  'http://localhost/',
  'http://LOCALHOST./',
  'http://api.localhost/',
]

t.test('every spelling of loopback is denied when private addresses are', async (t) => {
  for (const url of LOOPBACK_SPELLINGS) {
    const v = checkUrl(url, strict)
    t.equal(v.allowed, false, url)
    t.match(reasonOf(v), /loopback|private/, `${url}: ${reasonOf(v)}`)
    t.same(checkUrl(url, DEFAULT_POLICY), { allowed: true }, `${url} allowed with HOOKQ_PUSH_ALLOW_PRIVATE=true`)
  }
})

t.test('private ranges', async (t) => {
  for (const url of [
    'http://10.1.2.3/',
    'http://172.16.0.1/',
    'http://172.31.255.255/',
    'http://192.168.1.1/',
    'http://100.64.0.1/',
    'http://[fc00::1]/',
    'http://[fd12:3456::1]/',
    'http://[::ffff:10.0.0.1]/',
    'http://[::ffff:a00:1]/',
    'http://167772161/' /* 10.0.0.1 */,
  ]) {
    t.match(reasonOf(checkUrl(url, strict)), /private or loopback \(HOOKQ_PUSH_ALLOW_PRIVATE=false\)/, url)
  }
  for (const url of ['http://172.32.0.1/', 'http://192.169.0.1/', 'http://11.0.0.1/', 'http://100.128.0.1/', 'http://[fe00::1]/']) {
    t.same(checkUrl(url, strict), { allowed: true }, `${url} is outside every private range`)
  }
})

const METADATA_SPELLINGS = [
  'http://169.254.169.254/latest/meta-data/',
  'http://2852039166/',
  'http://0xa9fea9fe/',
  'http://0251.0376.0251.0376/',
  'http://169.254.43518/',
  'http://[::ffff:169.254.169.254]/',
  'http://[::ffff:a9fe:a9fe]/',
  'http://[64:ff9b::a9fe:a9fe]/',
  'http://[fd00:ec2::254]/',
  'http://100.100.100.200/',
  'http://[::ffff:100.100.100.200]/',
]

t.test('metadata addresses are denied in every spelling, whatever HOOKQ_PUSH_ALLOW_PRIVATE says', async (t) => {
  for (const p of [DEFAULT_POLICY, strict]) {
    for (const url of METADATA_SPELLINGS) {
      t.match(reasonOf(checkUrl(url, p)), /is denied by the push URL policy: it is a cloud metadata address/, url)
    }
    for (const url of ['http://metadata.google.internal/computeMetadata/v1/', 'http://Metadata.Google.Internal./']) {
      t.match(reasonOf(checkUrl(url, p)), /cloud metadata service/, url)
    }
  }
  const allowed = policy({ HOOKQ_PUSH_ALLOW_CIDRS: '169.254.169.254/32,fd00:ec2::254' })
  t.same(checkUrl('http://169.254.169.254/', allowed), { allowed: true }, 'listed in allowCidrs')
  t.same(checkUrl('http://[fd00:ec2::254]/', allowed), { allowed: true }, 'a bare address is a /128')
  t.match(reasonOf(checkUrl('http://169.254.1.1/', allowed)), /link-local/, 'the rest of link-local stays denied')
  t.same(checkUrl('http://metadata.google.internal/', policy({ HOOKQ_PUSH_ALLOW_HOSTS: 'metadata.google.internal' })), { allowed: true })
  t.match(
    reasonOf(checkUrl('http://metadata.google.internal/', policy({ HOOKQ_PUSH_ALLOW_HOSTS: '*.internal' }))),
    /metadata/,
    'a wildcard does not allow the metadata name',
  )
})

t.test('link-local, "this network" and unspecified are always denied', async (t) => {
  for (const url of [
    'http://169.254.1.1/',
    'http://[fe80::1]/',
    'http://[febf::1]/',
    'http://0.0.0.0/',
    'http://0/',
    'http://0.1.2.3/',
    'http://[::]/',
    'http://[::ffff:0.0.0.0]/',
    'http://[::ffff:169.254.0.1]/',
  ]) {
    t.match(reasonOf(checkUrl(url, DEFAULT_POLICY)), /link-local, unspecified or "this network"/, url)
  }
})

t.test('special-purpose ranges: never a webhook, denied even with private addresses allowed', async (t) => {
  const cases: [string, RegExp][] = [
    ['http://224.0.0.1/', /multicast/],
    ['http://239.255.255.250/', /multicast/],
    ['http://[ff02::1]/', /multicast/],
    ['http://240.0.0.1/', /reserved or broadcast/],
    ['http://255.255.255.255/', /reserved or broadcast/],
    ['http://4294967295/', /reserved or broadcast/],
    ['http://192.0.0.8/', /IETF protocol assignment/],
    ['http://192.0.0.170/', /IETF protocol assignment/],
    ['http://192.0.2.1/', /documentation/],
    ['http://198.51.100.7/', /documentation/],
    ['http://203.0.113.9/', /documentation/],
    ['http://[2001:db8::1]/', /documentation/],
    ['http://[100::1]/', /discard-only/],
    ['http://[::ffff:240.0.0.1]/', /reserved or broadcast/],
    ['http://192.88.99.1/', /6to4 relay anycast/],
    ['http://[::ffff:192.88.99.200]/', /6to4 relay anycast/],
    ['http://[2001::1]/', /Teredo/],
    ['http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/', /Teredo/],
    ['http://[2001:2::1]/', /IETF protocol assignment \(2001::\/23/],
    ['http://[2001:10::1]/', /IETF protocol assignment \(2001::\/23/],
    ['http://[2001:1f:ffff::1]/', /IETF protocol assignment \(2001::\/23/],
    ['http://[2001:20::1]/', /IETF protocol assignment \(2001::\/23/],
    ['http://[2001:1ff::1]/', /IETF protocol assignment \(2001::\/23/],
    ['http://[3fff::1]/', /documentation/],
    ['http://[3fff:fff::1]/', /documentation/],
    ['http://[100:0:0:1::1]/', /dummy prefix/],
    ['http://[5f00::1]/', /segment routing/],
    ['http://[fec0::1]/', /site-local/],
  ]
  for (const [url, why] of cases) {
    t.match(reasonOf(checkUrl(url, DEFAULT_POLICY)), why, url)
    t.match(reasonOf(checkUrl(url, strict)), why, `${url} (strict)`)
  }
  t.same(checkUrl('http://192.0.1.1/', strict), { allowed: true }, 'the neighbours of a special range are public')
  t.same(checkUrl('http://[2001:db9::1]/', strict), { allowed: true })
  for (const url of ['http://192.88.98.255/', 'http://192.88.100.0/', 'http://[2001:200::1]/', 'http://[4000::1]/', 'http://[5f01::1]/']) {
    t.same(checkUrl(url, strict), { allowed: true }, `${url}: next to a special range, public`)
  }
})

t.test('private-like ranges: benchmarking 198.18.0.0/15 and local-use NAT64 follow HOOKQ_PUSH_ALLOW_PRIVATE', async (t) => {
  for (const url of ['http://198.18.0.1/', 'http://198.19.255.254/', 'http://[64:ff9b:1::808:808]/']) {
    t.match(reasonOf(checkUrl(url, strict)), /private or loopback/, url)
    t.same(checkUrl(url, DEFAULT_POLICY), { allowed: true }, `${url} with private allowed`)
  }
  t.same(checkUrl('http://198.20.0.1/', strict), { allowed: true }, 'just past 198.18.0.0/15')
})

t.test('6to4, NAT64 and IPv4-translated forms are judged by the IPv4 address they embed', async (t) => {
  // 2002:AABB:CCDD::/48 carries AA.BB.CC.DD; 64:ff9b:1::/48 and ::ffff:0:0:0/96 carry it in the last 32 bits.
  for (const url of [
    'http://[2002:7f00:1::]/',
    'http://[2002:7f00:1:0:1::]/',
    'http://[2002:a00:1::1]/',
    'http://[::ffff:0:7f00:1]/',
    'http://[64:ff9b:1::7f00:1]/',
  ]) {
    t.match(reasonOf(checkUrl(url, strict)), /private or loopback/, url)
  }
  for (const url of [
    'http://[2002:a9fe:a9fe::]/',
    'http://[64:ff9b:1::a9fe:a9fe]/',
    'http://[::ffff:0:a9fe:a9fe]/',
    'http://[64:ff9b::a9fe:a9fe]/',
  ]) {
    t.match(reasonOf(checkUrl(url, DEFAULT_POLICY)), /cloud metadata/, url)
  }
  t.match(reasonOf(checkUrl('http://[2002:e000:1::]/', DEFAULT_POLICY)), /multicast/, '6to4 of 224.0.0.1')
  t.match(reasonOf(checkUrl('http://[2002:c000:201::]/', DEFAULT_POLICY)), /documentation/, '6to4 of 192.0.2.1')
  t.match(reasonOf(checkUrl('http://[2002:7f00:1::]/', strict)), /2002:7f00:1:: \(127\.0\.0\.1\)/, 'the reason shows the embedded address')
  t.same(checkUrl('http://[2002:808:808::1]/', strict), { allowed: true }, '6to4 of a public address')
  t.same(checkAddress('2002:808:808::1', 6, strict), { allowed: true })
  t.match(checkAddress('2002:7f00:1::', 6, strict), { allowed: false, reason: /private or loopback/ })
})

t.test('checkAddress: families, zones, mapped forms', async (t) => {
  t.same(checkAddress('93.184.216.34', 4, strict), { allowed: true })
  t.same(checkAddress('2606:2800:220:1::1', 'IPv6', strict), { allowed: true })
  t.match(checkAddress('169.254.169.254', 4, DEFAULT_POLICY), {
    allowed: false,
    reason: 'address 169.254.169.254 is denied by the push URL policy: it is a cloud metadata address',
  })
  t.match(checkAddress('::ffff:169.254.169.254', 6, DEFAULT_POLICY), {
    allowed: false,
    reason: /::ffff:169\.254\.169\.254 \(169\.254\.169\.254\)/,
  })
  t.match(checkAddress('fe80::1%eth0', 6, DEFAULT_POLICY), { allowed: false, reason: /link-local/ })
  t.match(checkAddress('127.0.0.1', 'IPv4', strict), { allowed: false, reason: /private or loopback/ })
  t.match(checkAddress('::1', undefined, strict), { allowed: false })
  t.same(checkAddress('::1', undefined, DEFAULT_POLICY), { allowed: true }, '::1 is loopback, not the IPv4-compatible 0.0.0.1')
  t.match(checkAddress('127.0.0.1', 6, strict), { allowed: false, reason: /not an IP address/ }, 'family must match')
  t.match(checkAddress('example.com', undefined, strict), { allowed: false, reason: /not an IP address/ })
})

t.test('allowCidrs override built-in and configured deny ranges', async (t) => {
  const p = policy({
    HOOKQ_PUSH_ALLOW_PRIVATE: 'false',
    HOOKQ_PUSH_ALLOW_CIDRS: '10.1.0.0/16, 127.0.0.1, fd00:1::/32',
    HOOKQ_PUSH_DENY_CIDRS: '93.184.216.0/24,2606:2800::/32, 1.1.1.7',
  })
  t.same(checkUrl('http://10.1.2.3/', p), { allowed: true })
  t.same(checkUrl('http://[::ffff:10.1.2.3]/', p), { allowed: true }, 'the mapped form of an allowed address')
  t.match(reasonOf(checkUrl('http://10.2.0.1/', p)), /private/)
  t.same(checkUrl('http://127.0.0.1:9/', p), { allowed: true })
  t.match(reasonOf(checkUrl('http://127.0.0.2/', p)), /private/)
  t.same(checkUrl('http://[fd00:1::5]/', p), { allowed: true })
  t.match(reasonOf(checkUrl('http://93.184.216.9/', p)), /HOOKQ_PUSH_DENY_CIDRS/)
  t.match(reasonOf(checkUrl('http://[::ffff:93.184.216.9]/', p)), /HOOKQ_PUSH_DENY_CIDRS/)
  t.match(reasonOf(checkUrl('http://[2606:2800::1]/', p)), /HOOKQ_PUSH_DENY_CIDRS/)
  t.match(reasonOf(checkUrl('http://1.1.1.7/', p)), /HOOKQ_PUSH_DENY_CIDRS/)
  t.same(checkUrl('http://1.1.1.8/', p), { allowed: true })
  const carve = policy({ HOOKQ_PUSH_DENY_CIDRS: '93.184.216.0/24', HOOKQ_PUSH_ALLOW_CIDRS: '93.184.216.64/26' })
  t.same(checkAddress('93.184.216.70', 4, carve), { allowed: true }, 'an allowed range carves out of a denied one')
  t.match(checkAddress('93.184.216.1', 4, carve), { allowed: false })
  t.same(
    checkUrl('http://203.0.113.9/', policy({ HOOKQ_PUSH_ALLOW_CIDRS: '203.0.113.0/24' })),
    { allowed: true },
    'a built-in special range can be allowed too',
  )
})

t.test('host lists: exact names and wildcards', async (t) => {
  const p = policy({ HOOKQ_PUSH_ALLOW_HOSTS: 'hooks.example.com,*.partner.example, 8.8.8.8', HOOKQ_PUSH_DENY_HOSTS: 'bad.partner.example' })
  t.same(checkUrl('https://hooks.example.com/x', p), { allowed: true })
  t.same(checkUrl('https://HOOKS.example.com./x', p), { allowed: true }, 'case and a trailing dot do not matter')
  t.same(checkUrl('https://a.partner.example/', p), { allowed: true })
  t.same(checkUrl('https://a.b.partner.example/', p), { allowed: true }, 'a wildcard covers deeper names')
  t.match(reasonOf(checkUrl('https://partner.example/', p)), /not in HOOKQ_PUSH_ALLOW_HOSTS/, 'but not the apex')
  t.match(reasonOf(checkUrl('https://evilpartner.example/', p)), /not in HOOKQ_PUSH_ALLOW_HOSTS/)
  t.match(reasonOf(checkUrl('https://hooks.example.com.evil.test/', p)), /not in HOOKQ_PUSH_ALLOW_HOSTS/)
  t.match(reasonOf(checkUrl('https://bad.partner.example/', p)), /in HOOKQ_PUSH_DENY_HOSTS/, 'deny wins over allow')
  t.same(checkUrl('http://134744072/', p), { allowed: true }, 'an IP literal in allowHosts, in another spelling')
  t.match(reasonOf(checkUrl('http://8.8.4.4/', p)), /not in HOOKQ_PUSH_ALLOW_HOSTS/)
  const deny = policy({ HOOKQ_PUSH_DENY_HOSTS: '*.corp.example,admin.example' })
  t.match(reasonOf(checkUrl('http://x.corp.example/', deny)), /DENY_HOSTS/)
  t.match(reasonOf(checkUrl('http://ADMIN.example./', deny)), /DENY_HOSTS/)
  t.same(checkUrl('http://corp.example/', deny), { allowed: true })
  const allowedLocal = policy({ HOOKQ_PUSH_ALLOW_PRIVATE: 'false', HOOKQ_PUSH_ALLOW_HOSTS: 'internal.example' })
  t.same(checkUrl('http://internal.example/', allowedLocal), { allowed: true }, 'names are not resolved at registration')
  t.match(checkAddress('10.0.0.5', 4, allowedLocal), { allowed: false }, 'an allowed name still needs its address allowed')
})

t.test('schemes: http can be turned off', async (t) => {
  const httpsOnly = policy({ HOOKQ_PUSH_ALLOW_HTTP: 'false' })
  t.match(reasonOf(checkUrl('http://hooks.example.com/', httpsOnly)), /HOOKQ_PUSH_ALLOW_HTTP=false/)
  t.same(checkUrl('https://hooks.example.com/', httpsOnly), { allowed: true })
  for (const url of ['ftp://hooks.example.com/', 'file:///etc/passwd', 'gopher://127.0.0.1:6379/_', 'not a url']) {
    t.equal(checkUrl(url, DEFAULT_POLICY).allowed, false, url)
  }
  t.same(checkUrl(new URL('https://hooks.example.com/'), httpsOnly), { allowed: true }, 'a parsed URL works too')
})

t.test('bad configuration: ConfigError naming the variable', async (t) => {
  const bad: [Record<string, string>, RegExp][] = [
    [{ HOOKQ_PUSH_ALLOW_CIDRS: '10.0.0.0/33' }, /^HOOKQ_PUSH_ALLOW_CIDRS: "10\.0\.0\.0\/33" is not a CIDR range/],
    [{ HOOKQ_PUSH_DENY_CIDRS: '10.0.0.0/8,banana' }, /^HOOKQ_PUSH_DENY_CIDRS: "banana"/],
    [{ HOOKQ_PUSH_DENY_CIDRS: '10.0.0.0/8/9' }, /^HOOKQ_PUSH_DENY_CIDRS/],
    [{ HOOKQ_PUSH_DENY_CIDRS: 'fd00::/129' }, /^HOOKQ_PUSH_DENY_CIDRS/],
    [{ HOOKQ_PUSH_DENY_CIDRS: '10.0.0.0/-1' }, /^HOOKQ_PUSH_DENY_CIDRS/],
    [{ HOOKQ_PUSH_ALLOW_CIDRS: '0x7f000001/32' }, /^HOOKQ_PUSH_ALLOW_CIDRS/],
    [{ HOOKQ_PUSH_ALLOW_HOSTS: 'a.*.example' }, /^HOOKQ_PUSH_ALLOW_HOSTS: "a\.\*\.example" is not a host name/],
    [{ HOOKQ_PUSH_DENY_HOSTS: 'bad host' }, /^HOOKQ_PUSH_DENY_HOSTS/],
    [{ HOOKQ_PUSH_ALLOW_PRIVATE: 'maybe' }, /^HOOKQ_PUSH_ALLOW_PRIVATE must be true or false/],
    [{ HOOKQ_PUSH_ALLOW_HTTP: 'nope' }, /^HOOKQ_PUSH_ALLOW_HTTP must be true or false/],
  ]
  for (const [env, message] of bad) {
    t.throws(() => parsePolicy(env), message, JSON.stringify(env))
    t.throws(() => loadConfig(env), ConfigError)
  }
  t.same(parsePolicy({ HOOKQ_PUSH_ALLOW_PRIVATE: ' FALSE ', HOOKQ_PUSH_ALLOW_HTTP: '0' }), {
    ...DEFAULT_POLICY,
    allowPrivate: false,
    allowHttp: false,
  } satisfies UrlPolicy)
})

/**
 * The push URL policy: which consumer URLs hookq may push to, so a broker that POSTs to
 * user-supplied URLs cannot be aimed at the network it runs in (SSRF).
 *
 * Checked twice:
 *   registration  `checkUrl` on the URL (scheme, host name lists, IP literals in any spelling);
 *                 no DNS is resolved here
 *   every connect `checkAddress` on each address DNS answers (pusher.ts wraps `dns.lookup`), and
 *                 `checkUrl` again before each push (IP literals never reach `lookup`); a name that
 *                 re-resolves to a denied address later (DNS rebinding) is refused at connect time
 *
 * Addresses denied unless a range in `allowCidrs` contains them:
 *   always        cloud metadata (169.254.169.254, fd00:ec2::254, 100.100.100.200), link-local
 *                 (169.254.0.0/16, fe80::/10), "this network" 0.0.0.0/8 and the unspecified `::`
 *                 (a connect to either reaches the local host on Linux); and the special-purpose
 *                 ranges no webhook lives in: multicast 224.0.0.0/4 and ff00::/8, reserved
 *                 240.0.0.0/4 with the broadcast 255.255.255.255, IETF protocol assignments
 *                 192.0.0.0/24 and 2001::/23 (Teredo 2001::/32, benchmarking, ORCHID), the 6to4 relay
 *                 anycast 192.88.99.0/24, documentation (192.0.2.0/24, 198.51.100.0/24,
 *                 203.0.113.0/24, 2001:db8::/32, 3fff::/20), discard-only 100::/64, the dummy
 *                 prefix 100:0:0:1::/64, segment routing SIDs 5f00::/16 and site-local fec0::/10
 *   allowPrivate  false: also private and loopback (10/8, 172.16/12, 192.168/16, 127/8, 100.64/10
 *                 carrier-grade NAT, 198.18.0.0/15 benchmarking, ::1, fc00::/7, local-use NAT64
 *                 64:ff9b:1::/48): ranges an operator may really run services in. The default is
 *                 true (HOOKQ_PUSH_ALLOW_PRIVATE) so the quickstart and local development can push
 *                 to 127.0.0.1; set it to false in production.
 *   denyCidrs     the operator's own ranges
 * IPv6 addresses that embed an IPv4 one (IPv4-mapped ::ffff:a.b.c.d, IPv4-translated
 * ::ffff:0:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::a.b.c.d and 64:ff9b:1::a.b.c.d,
 * 6to4 2002:AABB:CCDD::) are judged by the embedded IPv4 address as well, so 2002:7f00:1:: is
 * loopback and 2002:a9fe:a9fe:: the metadata address. Local-use NAT64 is read in the /96 layout
 * (the address in the last 32 bits), the one NAT64 gateways use in practice.
 *
 * Host names: `denyHosts` are refused; when `allowHosts` is not empty only the names (and IP
 * literals) it lists are accepted; `*.example.com` matches every name below example.com (not
 * example.com itself). metadata.google.internal is refused unless `allowHosts` names it exactly,
 * and with allowPrivate false so are `localhost` and `*.localhost`. An allowed host name does not
 * lift the address checks: an allowed name that resolves to a private address still needs that
 * address in `allowCidrs`.
 */
import { BlockList, isIP } from 'node:net'
import { bool, ConfigError } from '../core/config-values.ts'

export interface UrlPolicy {
  /** Plain http:// URLs accepted (default true); false means https:// only. */
  allowHttp: boolean
  /** Private and loopback ranges accepted (default true: local development; set false in production). */
  allowPrivate: boolean
  /** When not empty, the only host names accepted: exact names or `*.example.com`. */
  allowHosts: string[]
  /** Host names refused: exact names or `*.example.com`. */
  denyHosts: string[]
  /** Ranges accepted even where a deny rule (built-in or `denyCidrs`) covers them. */
  allowCidrs: string[]
  /** Extra ranges refused. */
  denyCidrs: string[]
}

export type Verdict = { allowed: true } | { allowed: false; reason: string }

/** The policy with nothing configured: what `parsePolicy({})` gives. */
export const DEFAULT_POLICY: Readonly<UrlPolicy> = Object.freeze({
  allowHttp: true,
  allowPrivate: true,
  allowHosts: [],
  denyHosts: [],
  allowCidrs: [],
  denyCidrs: [],
})

const METADATA_CIDRS = ['169.254.169.254/32', 'fd00:ec2::254/128', '100.100.100.200/32']
const RESERVED_CIDRS = ['169.254.0.0/16', 'fe80::/10', '0.0.0.0/8', '::/128']
/** Special-purpose ranges (IANA registries, RFC 6890) that are never a webhook, each with its reason. */
const SPECIAL_CIDRS: [string, string[]][] = [
  ['it is multicast', ['224.0.0.0/4', 'ff00::/8']],
  ['it is reserved or broadcast (240.0.0.0/4)', ['240.0.0.0/4']],
  ['it is an IETF protocol assignment (192.0.0.0/24)', ['192.0.0.0/24']],
  ['it is the deprecated 6to4 relay anycast range (192.88.99.0/24)', ['192.88.99.0/24']],
  ['it is a documentation range', ['192.0.2.0/24', '198.51.100.0/24', '203.0.113.0/24', '2001:db8::/32', '3fff::/20']],
  ['it is discard-only (100::/64)', ['100::/64']],
  ['it is the dummy prefix (100:0:0:1::/64)', ['100:0:0:1::/64']],
  // Teredo tunnels to an address it hides (XORed); the rest of 2001::/23 is benchmarking,
  // ORCHID identifiers and anycast protocol services, as 192.0.0.0/24 is for IPv4.
  ['it is Teredo (2001::/32)', ['2001::/32']],
  ['it is an IETF protocol assignment (2001::/23: benchmarking, ORCHID, ...)', ['2001::/23']],
  ['it is a segment routing SID range (5f00::/16)', ['5f00::/16']],
  ['it is deprecated site-local (fec0::/10)', ['fec0::/10']],
]
const PRIVATE_CIDRS = [
  '10.0.0.0/8',
  '172.16.0.0/12',
  '192.168.0.0/16',
  '127.0.0.0/8',
  '100.64.0.0/10',
  '198.18.0.0/15',
  '::1/128',
  'fc00::/7',
  '64:ff9b:1::/48',
]
const METADATA_NAMES = ['metadata.google.internal']

type Env = Record<string, string | undefined>

/** Reads the policy from HOOKQ_PUSH_* variables. Throws ConfigError naming the variable at fault. */
export function parsePolicy(env: Env): UrlPolicy {
  const policy: UrlPolicy = {
    allowHttp: bool(env, 'HOOKQ_PUSH_ALLOW_HTTP', true),
    allowPrivate: bool(env, 'HOOKQ_PUSH_ALLOW_PRIVATE', true),
    allowHosts: list(env, 'HOOKQ_PUSH_ALLOW_HOSTS'),
    denyHosts: list(env, 'HOOKQ_PUSH_DENY_HOSTS'),
    allowCidrs: list(env, 'HOOKQ_PUSH_ALLOW_CIDRS'),
    denyCidrs: list(env, 'HOOKQ_PUSH_DENY_CIDRS'),
  }
  const fields = [
    ['allowHosts', 'HOOKQ_PUSH_ALLOW_HOSTS', hostPattern],
    ['denyHosts', 'HOOKQ_PUSH_DENY_HOSTS', hostPattern],
    ['allowCidrs', 'HOOKQ_PUSH_ALLOW_CIDRS', parseCidr],
    ['denyCidrs', 'HOOKQ_PUSH_DENY_CIDRS', parseCidr],
  ] as const
  for (const [field, name, parse] of fields) {
    for (const item of policy[field]) {
      try {
        parse(item)
      } catch (err) {
        throw new ConfigError(`${name}: ${(err as Error).message}`)
      }
    }
  }
  compiled(policy)
  return policy
}

/**
 * Whether a consumer URL may be registered (and pushed to): scheme, host name lists, and, for an IP
 * literal in any spelling (decimal, hex, octal, short, IPv4-mapped IPv6, ...), the address ranges.
 * The WHATWG URL parser canonicalises IPv4 spellings, so `http://0x7f000001/` is judged as 127.0.0.1.
 */
export function checkUrl(url: string | URL, policy: UrlPolicy): Verdict {
  let parsed: URL
  try {
    parsed = typeof url === 'string' ? new URL(url) : url
  } catch {
    return deny('it is not a valid URL')
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return deny(`scheme ${parsed.protocol} is not http: or https:`)
  if (parsed.protocol === 'http:' && !policy.allowHttp) return deny('http:// is not allowed (HOOKQ_PUSH_ALLOW_HTTP=false): use https://')
  const host = normaliseHost(parsed.hostname)
  if (host === '') return deny('it has no host')
  const c = compiled(policy)
  if (c.denyHosts.some((p) => matches(p, host))) return deny(`host ${host} is in HOOKQ_PUSH_DENY_HOSTS`)
  if (c.allowHosts.length > 0 && !c.allowHosts.some((p) => matches(p, host))) return deny(`host ${host} is not in HOOKQ_PUSH_ALLOW_HOSTS`)
  if (isIP(host) !== 0) return checkAddress(host, undefined, policy)
  if (METADATA_NAMES.includes(host) && !c.allowHosts.some((p) => p.exact === host)) {
    return deny(`host ${host} is a cloud metadata service`)
  }
  if (!policy.allowPrivate && (host === 'localhost' || host.endsWith('.localhost'))) {
    return deny(`host ${host} is loopback (HOOKQ_PUSH_ALLOW_PRIVATE=false)`)
  }
  return { allowed: true }
}

/**
 * Whether hookq may connect to one address (what DNS answered for a consumer's host). `family` is
 * 4, 6, 'IPv4' or 'IPv6' as `dns.lookup` reports it, or undefined to work it out.
 */
export function checkAddress(ip: string, family: number | string | undefined, policy: UrlPolicy): Verdict {
  const address = ip.replace(/^\[|\]$/g, '').replace(/%.*$/, '') // brackets and an IPv6 zone id
  const fam = family === 4 || family === 'IPv4' ? 4 : family === 6 || family === 'IPv6' ? 6 : isIP(address)
  if ((fam !== 4 && fam !== 6) || isIP(address) !== fam) return { allowed: false, reason: `address ${ip} is not an IP address` }
  const forms: [string, 'ipv4' | 'ipv6'][] = [[address, fam === 4 ? 'ipv4' : 'ipv6']]
  const v4 = fam === 6 ? embeddedIpv4(address) : undefined
  if (v4 !== undefined) forms.push([v4, 'ipv4'])
  const c = compiled(policy)
  const inList = (list: BlockList) => forms.some(([a, t]) => list.check(a, t))
  if (inList(c.allow)) return { allowed: true }
  const why = inList(c.metadata)
    ? 'it is a cloud metadata address'
    : inList(c.reserved)
      ? 'it is link-local, unspecified or "this network"'
      : (c.special.find(([, list]) => inList(list))?.[0] ??
        (inList(c.private)
          ? 'it is private or loopback (HOOKQ_PUSH_ALLOW_PRIVATE=false)'
          : inList(c.deny)
            ? 'it is in HOOKQ_PUSH_DENY_CIDRS'
            : undefined))
  if (why === undefined) return { allowed: true }
  const shown = v4 !== undefined ? `${address} (${v4})` : address
  return { allowed: false, reason: `address ${shown} is denied by the push URL policy: ${why}` }
}

function deny(reason: string): Verdict {
  return { allowed: false, reason }
}

function list(env: Env, name: string): string[] {
  return (env[name] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0)
}

/** Lower case, no brackets around IPv6, no trailing dots (`metadata.google.internal.` is the same host). */
function normaliseHost(hostname: string): string {
  return hostname
    .toLowerCase()
    .replace(/^\[|\]$/g, '')
    .replace(/\.+$/, '')
}

type HostPattern = { exact: string; suffix?: undefined } | { exact?: undefined; suffix: string }

function hostPattern(text: string): HostPattern {
  const wildcard = text.startsWith('*.')
  const rest = wildcard ? text.slice(2) : text
  let host: string
  try {
    // The URL parser canonicalises the name as it does a consumer's (IDNA, IPv4 spellings, case).
    host = normaliseHost(new URL(`http://${rest.includes(':') && !rest.startsWith('[') ? `[${rest}]` : rest}/`).hostname)
  } catch {
    throw new Error(`${JSON.stringify(text)} is not a host name (use example.com or *.example.com)`)
  }
  if (host === '' || host.includes('*')) throw new Error(`${JSON.stringify(text)} is not a host name (use example.com or *.example.com)`)
  return wildcard ? { suffix: `.${host}` } : { exact: host }
}

function matches(p: HostPattern, host: string): boolean {
  return p.exact !== undefined ? host === p.exact : host.endsWith(p.suffix)
}

/** `a.b.c.d/n`, `x::y/n`, or a bare address (/32 or /128). Throws with a message naming the entry. */
function parseCidr(text: string): { address: string; prefix: number; type: 'ipv4' | 'ipv6' } {
  const [address = '', prefixText, ...extra] = text.split('/')
  const fam = isIP(address)
  const max = fam === 4 ? 32 : 128
  const prefix = prefixText === undefined ? max : /^\d{1,3}$/.test(prefixText) ? Number(prefixText) : NaN
  if (fam === 0 || extra.length > 0 || !(prefix >= 0 && prefix <= max)) {
    throw new Error(`${JSON.stringify(text)} is not a CIDR range (use 10.0.0.0/8, fd00::/8 or a single address)`)
  }
  return { address, prefix, type: fam === 4 ? 'ipv4' : 'ipv6' }
}

function blockList(cidrs: readonly string[]): BlockList {
  const list = new BlockList()
  for (const text of cidrs) {
    const { address, prefix, type } = parseCidr(text)
    list.addSubnet(address, prefix, type)
  }
  return list
}

interface Compiled {
  allow: BlockList
  metadata: BlockList
  reserved: BlockList
  special: [string, BlockList][]
  private: BlockList
  deny: BlockList
  allowHosts: HostPattern[]
  denyHosts: HostPattern[]
}

const cache = new WeakMap<UrlPolicy, Compiled>()
const BUILT_IN = {
  metadata: blockList(METADATA_CIDRS),
  reserved: blockList(RESERVED_CIDRS),
  private: blockList(PRIVATE_CIDRS),
  special: SPECIAL_CIDRS.map(([why, cidrs]): [string, BlockList] => [why, blockList(cidrs)]),
}
const NOTHING = new BlockList()

/** The policy's lists, parsed once per policy object (treat a policy as immutable once used). */
function compiled(policy: UrlPolicy): Compiled {
  let c = cache.get(policy)
  if (!c) {
    c = {
      allow: blockList(policy.allowCidrs),
      metadata: BUILT_IN.metadata,
      reserved: BUILT_IN.reserved,
      special: BUILT_IN.special,
      private: policy.allowPrivate ? NOTHING : BUILT_IN.private,
      deny: blockList(policy.denyCidrs),
      allowHosts: policy.allowHosts.map(hostPattern),
      denyHosts: policy.denyHosts.map(hostPattern),
    }
    cache.set(policy, c)
  }
  return c
}

/**
 * The IPv4 address inside an IPv4-mapped (::ffff:0:0/96), IPv4-translated (::ffff:0:0:0/96),
 * -compatible (::/96 but :: and ::1), NAT64 (64:ff9b::/96, and 64:ff9b:1::/48 read as /96) or 6to4
 * (2002::/16, the address in bits 16 to 47) address.
 */
function embeddedIpv4(ipv6: string): string | undefined {
  const words = expandIpv6(ipv6)
  if (!words) return undefined
  const quad = (hi: number, lo: number) => [hi >> 8, hi & 0xff, lo >> 8, lo & 0xff].join('.')
  if (words[0] === 0x2002) return quad(words[1]!, words[2]!)
  const head = words.slice(0, 6)
  const zeros4 = head.slice(0, 4).every((w) => w === 0)
  const mapped = zeros4 && head[4] === 0 && head[5] === 0xffff
  const translated = zeros4 && head[4] === 0xffff && head[5] === 0
  const compatible = zeros4 && head[4] === 0 && head[5] === 0 && (words[6] !== 0 || words[7]! > 1)
  const nat64 = head[0] === 0x64 && head[1] === 0xff9b && head.slice(2).every((w) => w === 0)
  const localNat64 = head[0] === 0x64 && head[1] === 0xff9b && head[2] === 1
  if (!mapped && !translated && !compatible && !nat64 && !localNat64) return undefined
  return quad(words[6]!, words[7]!)
}

/** The eight 16-bit words of an IPv6 address (with `::` and a trailing dotted quad), or undefined. */
function expandIpv6(text: string): number[] | undefined {
  let s = text
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s)
  if (quad) {
    const b = quad.slice(1).map(Number) as [number, number, number, number]
    s = `${s.slice(0, quad.index)}${((b[0] << 8) | b[1]).toString(16)}:${((b[2] << 8) | b[3]).toString(16)}`
  }
  const halves = s.split('::')
  if (halves.length > 2) return undefined
  const part = (h: string) => (h === '' ? [] : h.split(':').map((w) => parseInt(w, 16)))
  const left = part(halves[0]!)
  const right = halves.length === 2 ? part(halves[1]!) : []
  const fill = halves.length === 2 ? 8 - left.length - right.length : 0
  const words = [...left, ...Array<number>(Math.max(0, fill)).fill(0), ...right]
  return words.length === 8 && words.every((w) => Number.isInteger(w) && w >= 0 && w <= 0xffff) ? words : undefined
}

/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com/, the scheme svix uses).
 *
 *   signed content   `${webhook-id}.${webhook-timestamp}.${body}`   (timestamp in whole seconds)
 *   key              the bytes of the secret: `whsec_` + base64, the base64 part decoded
 *   header           `webhook-signature: v1,<base64 HMAC-SHA256> v1,<...>`  one entry per secret
 *
 * Several secrets sign at once during a rotation, so a consumer that still holds the old one keeps
 * verifying until it switches. Secrets without the `whsec_` prefix are read exactly like the
 * Standard Webhooks libraries read them (they strip the prefix only when present): the whole
 * string is the base64 key. A secret that is not base64 or decodes outside 24–64 bytes (the spec's
 * recommended range) is refused, so the consumer route can answer 400 instead of signing with
 * a key its users' libraries would decode differently.
 */
import { createHmac, randomBytes } from 'node:crypto'

/** The prefix Standard Webhooks puts before the base64 of a secret's bytes. */
export const SECRET_PREFIX = 'whsec_'
/** Fewest and most key bytes a secret may have (Standard Webhooks: 24 to 64). */
export const SECRET_MIN_BYTES = 24
export const SECRET_MAX_BYTES = 64

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/

/**
 * The HMAC key of a secret: the base64 after the optional `whsec_` prefix, decoded.
 * Throws a RangeError naming the problem for anything else; use it to validate secrets on input.
 */
export function decodeSecret(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret
  if (!BASE64.test(encoded)) throw new RangeError('webhook secret must be "whsec_" followed by base64')
  const key = Buffer.from(encoded, 'base64')
  if (key.length < SECRET_MIN_BYTES || key.length > SECRET_MAX_BYTES) {
    throw new RangeError(`webhook secret must decode to ${SECRET_MIN_BYTES}–${SECRET_MAX_BYTES} bytes, got ${key.length}`)
  }
  return key
}

/** A new random secret: `whsec_` + base64 of `bytes` random bytes (default 32, i.e. 256 bits). */
export function generateSecret(bytes = 32): string {
  if (!Number.isInteger(bytes) || bytes < SECRET_MIN_BYTES || bytes > SECRET_MAX_BYTES) {
    throw new RangeError(`secret length must be ${SECRET_MIN_BYTES}–${SECRET_MAX_BYTES} bytes, got ${bytes}`)
  }
  return SECRET_PREFIX + randomBytes(bytes).toString('base64')
}

/** What one push signs: its `webhook-id`, `webhook-timestamp` (seconds) and the exact body bytes. */
export interface SignInput {
  id: string
  timestampS: number
  body: string | Buffer
}

/** The base64 HMAC-SHA256 of one signed content under one key. The body is hashed as its bytes. */
function digestBase64(key: Buffer, { id, timestampS, body }: SignInput): string {
  return createHmac('sha256', key).update(`${id}.${timestampS}.`).update(body).digest('base64')
}

/**
 * A secret's two keys: its own (webhook-signature) and HMAC(it, "hookq-signature") for
 * hookq-signature, so a hookq-signature is never also a valid webhook-signature over its header
 * text as a body. Decoded once per secret (bounded cache): every push to a consumer signs with the
 * same one or two, and decoding is a regex and a base64 decode.
 */
const secretKeys = new Map<string, { body: Buffer; headers: Buffer }>()
function keysOf(secret: string): { body: Buffer; headers: Buffer } {
  let keys = secretKeys.get(secret)
  if (!keys) {
    const body = decodeSecret(secret)
    keys = { body, headers: createHmac('sha256', body).update('hookq-signature').digest() }
    if (secretKeys.size >= 10_000) secretKeys.clear()
    secretKeys.set(secret, keys)
  }
  return keys
}

/**
 * The `webhook-signature` header value: `v1,<signature>` per secret, space-separated, in the order
 * of `secrets` (new secret first during a rotation, by convention). Throws on an empty list or an
 * invalid secret: both are caller bugs, since secrets are validated when a consumer registers.
 */
export function signWebhook(input: SignInput & { secrets: readonly string[] }): string {
  if (input.secrets.length === 0) throw new RangeError('signWebhook needs at least one secret')
  if (!Number.isInteger(input.timestampS) || input.timestampS < 0) {
    throw new RangeError(`timestampS must be a whole number of seconds, got ${input.timestampS}`)
  }
  return input.secrets.map((secret) => `v1,${digestBase64(keysOf(secret).body, input)}`).join(' ')
}

/**
 * The push headers `hookq-signature` covers, in this order. Standard Webhooks signs only the id,
 * timestamp and body, which leaves a raw push's metadata (topic, partition, offset, key, ...)
 * open to change in a captured push. Envelope pushes carry the first and the attempt too.
 * The consumer helper (clients/typescript/src/verify.ts) holds the same list; a test keeps them equal.
 */
export const SIGNED_HEADERS = [
  'hookq-delivery-id',
  'hookq-attempt',
  'hookq-topic',
  'hookq-group',
  'hookq-partition',
  'hookq-offset',
  'hookq-ack-deadline',
  'hookq-timestamp',
  'hookq-key',
  'hookq-headers',
] as const

/**
 * What `hookq-signature` signs in place of a body: `name:value` per signed header present, one per
 * line, in SIGNED_HEADERS order; an absent header has no line, so absent and empty differ.
 */
function signedHeaderContent(headers: Readonly<Record<string, string>>): string {
  const lines: string[] = []
  for (const name of SIGNED_HEADERS) if (headers[name] !== undefined) lines.push(`${name}:${headers[name]}`)
  return lines.join('\n')
}

/**
 * The `hookq-signature` header value: `v1,<signature>` per secret, like signWebhook, over the
 * push's id, timestamp and signedHeaderContent(headers), with each secret's header key.
 */
export function signHeaders(input: {
  id: string
  timestampS: number
  headers: Readonly<Record<string, string>>
  secrets: readonly string[]
}): string {
  if (input.secrets.length === 0) throw new RangeError('signHeaders needs at least one secret')
  const content = { id: input.id, timestampS: input.timestampS, body: signedHeaderContent(input.headers) }
  return input.secrets.map((secret) => `v1,${digestBase64(keysOf(secret).headers, content)}`).join(' ')
}

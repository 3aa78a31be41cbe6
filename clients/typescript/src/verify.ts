/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com/), as hookq signs its pushes.
 *
 *   signed content   `${webhook-id}.${webhook-timestamp}.${raw body}`   (timestamp in whole seconds)
 *   key              the secret's bytes: `whsec_` + base64, the base64 part decoded
 *   header           `webhook-signature: v1,<base64 HMAC-SHA256> v1,<...>`   one entry per secret
 *
 * During a secret rotation the broker signs with the new and the old secret at once, so the header
 * carries two `v1,` entries; one match is enough. A consumer rotating on its side passes both of
 * its secrets (`secrets: [next, current]`). Only node:crypto: this file stands alone.
 */
import { createHmac, timingSafeEqual } from 'node:crypto'

/** The prefix Standard Webhooks puts before the base64 of a secret's bytes. */
export const SECRET_PREFIX = 'whsec_'
/** Default allowed clock difference between the broker and this process, s (Standard Webhooks' 5 minutes). */
export const DEFAULT_TOLERANCE_SECONDS = 300

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/

/** Why a push failed verification. */
export type WebhookVerificationReason =
  | 'missing_headers'
  | 'invalid_timestamp'
  | 'timestamp_out_of_tolerance'
  | 'bad_signature'
  | 'bad_header_signature'

/** A push that must not be trusted: answer 401 and do not run anything for it. */
export class WebhookVerificationError extends Error {
  readonly reason: WebhookVerificationReason

  constructor(reason: WebhookVerificationReason, message: string) {
    super(message)
    this.name = 'WebhookVerificationError'
    this.reason = reason
  }
}

/** Request headers as node:http (lower-case keys, maybe arrays), Fastify, or fetch (`Headers`) give them. */
export type HeaderSource = Headers | Record<string, string | string[] | undefined>

/** One header's value; repeated headers are joined with a space (how several signatures may arrive). */
export function headerValue(headers: HeaderSource, name: string): string | undefined {
  if (typeof (headers as Headers).get === 'function') return (headers as Headers).get(name) ?? undefined
  const record = headers as Record<string, string | string[] | undefined>
  const value = record[name] ?? Object.entries(record).find(([k]) => k.toLowerCase() === name)?.[1]
  return Array.isArray(value) ? value.join(' ') : value
}

/**
 * The HMAC key of a secret: the base64 after the optional `whsec_` prefix, decoded (the prefix is
 * stripped only when present, as the Standard Webhooks libraries do). Throws a TypeError for
 * anything else: a wrong secret is a configuration error, found at start-up, not per request.
 */
export function decodeSecret(secret: string): Buffer {
  if (typeof secret !== 'string') throw new TypeError('a webhook secret must be a string ("whsec_" followed by base64)')
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret
  if (!BASE64.test(encoded)) throw new TypeError('a webhook secret must be "whsec_" followed by base64')
  return Buffer.from(encoded, 'base64')
}

/** What a signature covers: the push's `webhook-id`, `webhook-timestamp` (seconds) and raw body. */
export interface SignedContent {
  webhookId: string
  timestampSeconds: number
  body: string | Uint8Array
}

function digest(key: Buffer, { webhookId, timestampSeconds, body }: SignedContent): Buffer {
  return createHmac('sha256', key).update(`${webhookId}.${timestampSeconds}.`).update(body).digest()
}

/**
 * The hookq push headers `hookq-signature` covers, in order. Standard Webhooks signs the id,
 * timestamp and body only; in raw format the message's coordinates (topic, partition, offset,
 * key, ...) travel in these headers, so the broker signs them too. Same list as the broker's
 * (src/core/signature.ts); a test keeps them equal.
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
export function signedHeaderContent(headers: HeaderSource): string {
  const lines: string[] = []
  for (const name of SIGNED_HEADERS) {
    const value = headerValue(headers, name)
    if (value !== undefined) lines.push(`${name}:${value}`)
  }
  return lines.join('\n')
}

/**
 * hookq-signature's key: HMAC(secret's key, "hookq-signature"), so that it is never also a valid
 * webhook-signature over the header text taken as a body.
 */
function headerKey(key: Buffer): Buffer {
  return createHmac('sha256', key).update('hookq-signature').digest()
}

/**
 * The `hookq-signature` value for a push's hookq-* headers under each secret, space-separated.
 * The broker signs for you; this is for tests of your own consumer with hand-made pushes.
 */
export function signHeaders(content: {
  webhookId: string
  timestampSeconds: number
  headers: HeaderSource
  secrets: string | readonly string[]
}): string {
  const secrets = typeof content.secrets === 'string' ? [content.secrets] : content.secrets
  if (secrets.length === 0) throw new TypeError('signHeaders needs at least one secret')
  const signed = { webhookId: content.webhookId, timestampSeconds: content.timestampSeconds, body: signedHeaderContent(content.headers) }
  return secrets.map((s) => `v1,${digest(headerKey(decodeSecret(s)), signed).toString('base64')}`).join(' ')
}

/** Whether some `v1,` entry of a signature header is the HMAC of `content` under one of `keys`, compared in constant time. */
function anyMatches(keys: Buffer[], signatures: string, content: SignedContent): boolean {
  const expected = keys.map((key) => digest(key, content))
  // Other versions (e.g. `v1a`, asymmetric) are skipped, as the spec asks.
  const received = signatures
    .split(' ')
    .filter((e) => e.startsWith('v1,'))
    .map((e) => Buffer.from(e.slice(3), 'base64'))
  // Every pair is compared, without an early exit, so the time taken says nothing about which matched.
  let matched = false
  for (const want of expected) {
    for (const got of received) {
      if (got.length === want.length && timingSafeEqual(got, want)) matched = true
    }
  }
  return matched
}

/**
 * The `webhook-signature` value for `content` under each secret, space-separated. The broker
 * signs for you; this is for tests of your own consumer, and for replaying a push by hand.
 */
export function signWebhook(content: SignedContent & { secrets: string | readonly string[] }): string {
  const secrets = typeof content.secrets === 'string' ? [content.secrets] : content.secrets
  if (secrets.length === 0) throw new TypeError('signWebhook needs at least one secret')
  return secrets.map((s) => `v1,${digest(decodeSecret(s), content).toString('base64')}`).join(' ')
}

/** What `verifyWebhook` checks a push against. */
export interface VerifyWebhookOptions {
  /** The consumer's secret (`whsec_...`); or `secrets` while you rotate. */
  secret?: string
  /** Several secrets, any of which may match (your next and current one during a rotation). */
  secrets?: readonly string[]
  headers: HeaderSource
  /** The body exactly as received, before any JSON parse: a re-serialised object would not match. */
  body: string | Uint8Array
  /** Allowed difference between `webhook-timestamp` and now, either way, s (default 300). */
  toleranceSeconds?: number
  /** Now, ms since the epoch (default Date.now()); for tests. */
  nowMs?: number
  /**
   * Require `hookq-signature` even on a push without hookq-* headers (default false: a plain
   * Standard Webhooks push verifies). Set it when every push comes from hookq, as the consumer
   * helper does: otherwise a raw push replayed with its hookq-* headers stripped would verify.
   */
  requireHeaderSignature?: boolean
}

/** The verified push's id and timestamp. */
export interface VerifiedWebhook {
  webhookId: string
  timestampSeconds: number
}

/**
 * Checks a received push: the three `webhook-*` headers are present, the timestamp is within
 * `toleranceSeconds` of now (a captured push cannot be replayed later), and some `v1,` entry of
 * `webhook-signature` is the HMAC of the content under one of the secrets, compared in constant
 * time. When the push has `hookq-*` headers (hookq's pushes do), `hookq-signature` must match
 * them the same way (signedHeaderContent). Returns the id and timestamp, or throws a
 * WebhookVerificationError naming the reason.
 * Throws a TypeError for a missing or malformed secret (a configuration error).
 */
export function verifyWebhook(options: VerifyWebhookOptions): VerifiedWebhook {
  const secrets = [...(options.secret !== undefined ? [options.secret] : []), ...(options.secrets ?? [])]
  if (secrets.length === 0) throw new TypeError('verifyWebhook needs `secret` or `secrets`')
  const keys = secrets.map(decodeSecret)
  const { headers, body, toleranceSeconds = DEFAULT_TOLERANCE_SECONDS, nowMs = Date.now() } = options
  // NaN (say, Number of an unset variable) would make the timestamp check pass for any push.
  if (!(Number.isFinite(toleranceSeconds) && toleranceSeconds >= 0))
    throw new TypeError(`toleranceSeconds must be a finite number ≥ 0, got ${toleranceSeconds}`)

  const webhookId = headerValue(headers, 'webhook-id')
  const timestamp = headerValue(headers, 'webhook-timestamp')
  const signatures = headerValue(headers, 'webhook-signature')
  if (!webhookId || !timestamp || !signatures) {
    throw new WebhookVerificationError('missing_headers', 'webhook-id, webhook-timestamp and webhook-signature are required')
  }
  if (!/^\d{1,15}$/.test(timestamp)) throw new WebhookVerificationError('invalid_timestamp', 'webhook-timestamp is not a number of seconds')
  const timestampSeconds = Number(timestamp)
  if (Math.abs(nowMs / 1000 - timestampSeconds) > toleranceSeconds) {
    throw new WebhookVerificationError('timestamp_out_of_tolerance', `webhook-timestamp is more than ${toleranceSeconds} s away from now`)
  }

  if (!anyMatches(keys, signatures, { webhookId, timestampSeconds, body })) {
    throw new WebhookVerificationError('bad_signature', 'no v1 signature matches the secret')
  }
  // A push carrying hookq-* headers (every push from hookq) must have them signed as well: an
  // altered or stripped header would change what the consumer reads in raw format.
  const headerSignatures = headerValue(headers, 'hookq-signature')
  if (
    options.requireHeaderSignature === true ||
    headerSignatures !== undefined ||
    SIGNED_HEADERS.some((name) => headerValue(headers, name) !== undefined)
  ) {
    if (!headerSignatures)
      throw new WebhookVerificationError('missing_headers', 'hookq-signature is required (it signs the hookq-* headers)')
    if (!anyMatches(keys.map(headerKey), headerSignatures, { webhookId, timestampSeconds, body: signedHeaderContent(headers) })) {
      throw new WebhookVerificationError('bad_header_signature', 'no v1 hookq-signature matches the secret: a hookq-* header was changed')
    }
  }
  return { webhookId, timestampSeconds }
}

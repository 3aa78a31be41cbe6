/**
 * Secrets at rest: every secret value (consumer signing secrets, push auth header values and client
 * secrets, JWT signing keys) is sealed with AES-256-GCM before it reaches PostgreSQL, when
 * HOOKQ_SECRETS_KEY is set.
 *
 *   envelope   `hqenc:2:<kid>:<nonce b64url>:<ciphertext+tag b64url>`
 *   kid        the first 12 hex digits of SHA-256("hookq-secrets-key:" + key): names the key, not secret
 *   nonce      12 random bytes per seal (GCM's limit of 2^32 seals per key is far away: a seal per write)
 *   AAD        `hookq:2:` + JSON of [table, field, row id, context]: a sealed value copied to another row or
 *              column fails to open, and so does one whose context changed: a consumer's auth values
 *              are bound to where they are sent (its URL for headers, tokenUrl and clientId for
 *              OAuth), so pointing a row at another endpoint in the database leaves them sealed.
 *              Version 1 (`hookq:<table>.<field>:<row id>`, no context) is still opened, and sealed
 *              again as version 2 by the re-encryption (`hookq secrets rotate`; not at start-up, docs/operations.md).
 *
 * A stored value without the `hqenc:` prefix is clear text (written before a key was configured, or
 * with none): it is read as it is and sealed again by the re-encryption (see docs/security.md).
 * HOOKQ_SECRETS_KEY_PREVIOUS (comma-separated) keys open values but never seal them: during a key
 * rotation every process can read both while `hookq secrets rotate` re-seals to the new key.
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto'

const PREFIX = 'hqenc:'
/** The envelope (and AAD) version sealed now; '1' is opened too (no context in its AAD). */
const VERSION = '2'
const VERSIONS = new Set(['1', '2'])
const KEY_BYTES = 32
const NONCE_BYTES = 12
const TAG_BYTES = 16

/** Where a sealed value lives: its table, its column and its row's id. */
export interface SecretPlace {
  table: string
  field: string
  rowId: string
  /** Where the value may be used (a consumer's auth: its endpoint); changing it unseals nothing. */
  context?: string
}

/** A value that cannot be opened: its key is not configured, or it does not authenticate. */
export class SecretsKeyError extends Error {
  override name = 'SecretsKeyError'
}

/** A configured key: its id and bytes. */
interface Key {
  kid: string
  bytes: Buffer
}

/** The id of a key, as envelopes name it. */
export function keyId(bytes: Buffer): string {
  return createHash('sha256').update('hookq-secrets-key:').update(bytes).digest('hex').slice(0, 12)
}

/**
 * A key variable's value as bytes: base64 (or base64url) of exactly 32 bytes. Throws a RangeError
 * naming the variable (never the value) otherwise.
 */
export function parseSecretsKey(raw: string, variable: string): Buffer {
  const text = raw.trim()
  // Node's base64 decoder reads the base64url alphabet too.
  const bytes = /^[A-Za-z0-9+/_-]+={0,2}$/.test(text) ? Buffer.from(text, 'base64') : undefined
  if (!bytes || bytes.length !== KEY_BYTES) {
    throw new RangeError(
      `${variable} must be the base64 of 32 random bytes (openssl rand -base64 32), got ${bytes ? `${bytes.length} bytes` : 'something else'}`,
    )
  }
  return bytes
}

function aad(place: SecretPlace, version: string): Buffer {
  if (version === '1') return Buffer.from(`hookq:${place.table}.${place.field}:${place.rowId}`)
  return Buffer.from(`hookq:2:${JSON.stringify([place.table, place.field, place.rowId, place.context ?? null])}`)
}

/** Seals and opens secret values with the configured keys (none: values are stored in the clear). */
export class SecretBox {
  private readonly current: Key | undefined
  private readonly keys = new Map<string, Key>()

  constructor(current?: Buffer, previous: readonly Buffer[] = []) {
    if (current) {
      this.current = { kid: keyId(current), bytes: current }
      this.keys.set(this.current.kid, this.current)
    }
    for (const bytes of previous) {
      const key = { kid: keyId(bytes), bytes }
      if (!this.keys.has(key.kid)) this.keys.set(key.kid, key)
    }
  }

  /** True when values are sealed on write (HOOKQ_SECRETS_KEY is set). */
  get sealing(): boolean {
    return this.current !== undefined
  }

  /** The id of the key new values are sealed with, if any. */
  get currentKid(): string | undefined {
    return this.current?.kid
  }

  /** Whether a key of this id is configured (current or previous). */
  hasKey(kid: string): boolean {
    return this.keys.has(kid)
  }

  /** The value as it is stored: sealed with the current key, or clear without one. */
  seal(clear: string, place: SecretPlace): string {
    if (!this.current) return clear
    const nonce = randomBytes(NONCE_BYTES)
    const cipher = createCipheriv('aes-256-gcm', this.current.bytes, nonce)
    cipher.setAAD(aad(place, VERSION))
    const sealed = Buffer.concat([cipher.update(clear, 'utf8'), cipher.final(), cipher.getAuthTag()])
    return `${PREFIX}${VERSION}:${this.current.kid}:${nonce.toString('base64url')}:${sealed.toString('base64url')}`
  }

  /** The clear value of a stored one. Throws a SecretsKeyError that names the key id (never a value). */
  open(stored: string, place: SecretPlace): string {
    if (!stored.startsWith(PREFIX)) return stored
    const parts = stored.split(':')
    if (parts.length !== 5 || !VERSIONS.has(parts[1]!)) {
      throw new SecretsKeyError(`${place.table}.${place.field} of ${place.rowId} is sealed in an unknown format`)
    }
    const [, version, kid, nonceText, sealedText] = parts as [string, string, string, string, string]
    const key = this.keys.get(kid)
    if (!key) {
      throw new SecretsKeyError(
        `${place.table}.${place.field} of ${place.rowId} is sealed with secrets key ${kid}, which is not configured ` +
          `(HOOKQ_SECRETS_KEY${this.keys.size > 0 ? ' or HOOKQ_SECRETS_KEY_PREVIOUS' : ' is not set'})`,
      )
    }
    const sealed = Buffer.from(sealedText, 'base64url')
    const nonce = Buffer.from(nonceText, 'base64url')
    if (nonce.length !== NONCE_BYTES || sealed.length < TAG_BYTES) {
      throw new SecretsKeyError(`${place.table}.${place.field} of ${place.rowId} is damaged`)
    }
    try {
      const decipher = createDecipheriv('aes-256-gcm', key.bytes, nonce)
      decipher.setAAD(aad(place, version))
      decipher.setAuthTag(sealed.subarray(sealed.length - TAG_BYTES))
      return Buffer.concat([decipher.update(sealed.subarray(0, sealed.length - TAG_BYTES)), decipher.final()]).toString('utf8')
    } catch {
      throw new SecretsKeyError(
        `${place.table}.${place.field} of ${place.rowId} does not authenticate under secrets key ${kid} (altered, moved from another row, or its endpoint changed in the database)`,
      )
    }
  }

  /** True when a stored value should be sealed again: clear while a key is set, sealed with another key, or as version 1. */
  needsReseal(stored: string): boolean {
    if (!this.current) return false
    return sealedKid(stored) !== this.current.kid || !stored.startsWith(`${PREFIX}${VERSION}:`)
  }
}

/** The key id a stored value is sealed with; null for a clear value. */
export function sealedKid(stored: string): string | null {
  if (!stored.startsWith(PREFIX)) return null
  return stored.split(':')[2] ?? null
}

/**
 * The broker's push JWTs (consumer auth type "jwt"): ES256 tokens signed with keys kept in the
 * database (jwt_keys), so every broker process of one database signs with keys it lists at
 * /.well-known/jwks.json. JOSE is `jose` (panva/jose: no dependencies, WebCrypto, the library most
 * Node OIDC code verifies with).
 *
 * A key's life:  publishAt ── listed ──► signFrom ── signs ──► (next key's signFrom) ── listed ──► expiresAt
 * A rotation publishes the new key at once and signs with it only `propagationMs` later, longer than
 * any process's refresh interval (HOOKQ_JWT_KEYS_REFRESH_MS) and time for verifiers to refetch the
 * JWKS; the keys it replaces stay listed until every token they signed has expired (signFrom +
 * propagationMs + the token lifetime).
 *
 * Tokens: 5 minutes long, cached per consumer and reused until a minute before they expire: one
 * ECDSA signature per consumer every 4 minutes, not per push (a signature costs several times a
 * whole push; docs/performance.md). Each token has its own jti (the contract asks one per token);
 * a token is re-sent within its life, so a consumer must not treat jti as a once-only nonce, and
 * a captured token can be replayed until it expires (docs/security.md).
 *
 * A push asks for its header line (`authLine`), which is the cached token's whole line: no string
 * made per push, and one check of a precomputed deadline. The deadline is the token's renewal time
 * or the moment a listed key takes over signing, whichever is first; a refresh that changes the
 * keys or the issuer makes every cached token stale (`generation`).
 */
import { randomUUID } from 'node:crypto'
import { calculateJwkThumbprint, exportJWK, generateKeyPair, importJWK, SignJWT, type CryptoKey, type JWK } from 'jose'
import type { SecretBox } from '../security/secrets.ts'
import { inTransaction, type Database, type Queryable } from '../store/db.ts'
import { insertFirstJwtKey, listLiveJwtKeys, rotateJwtKeys, type JwtKeyRow } from '../store/jwt-keys.ts'

/** The algorithm of the keys made here (the contract allows ES256, RS256 or EdDSA; ES256 is the most widely verified of the small ones). */
export const JWT_ALG = 'ES256'
/** A token's lifetime, s (the contract's ceiling is 1 hour). */
export const JWT_TTL_S = 300
/** A cached token is replaced this long before it expires, s. */
const RENEW_BEFORE_S = 60

function placeOf(kid: string) {
  return { table: 'jwt_keys', field: 'private_jwk', rowId: kid }
}

/** A new key pair as a jwt_keys row, its private JWK sealed; published at `publishAt`, signing from `signFrom`. */
async function newKeyRow(box: SecretBox, publishAt: Date, signFrom: Date): Promise<JwtKeyRow> {
  const { publicKey, privateKey } = await generateKeyPair(JWT_ALG, { extractable: true })
  const publicJwk = await exportJWK(publicKey)
  const kid = await calculateJwkThumbprint(publicJwk)
  const privateJwk = await exportJWK(privateKey)
  return {
    kid,
    alg: JWT_ALG,
    publicJwk: JSON.stringify({ ...publicJwk, kid, alg: JWT_ALG, use: 'sig' }),
    privateJwk: box.seal(JSON.stringify(privateJwk), placeOf(kid)),
    publishAt,
    signFrom,
    expiresAt: null,
  }
}

/**
 * Rotates the signing key (`hookq jwks rotate`): the new key is listed now and signs from now +
 * propagationMs; the current keys stay listed until their last token has expired. Returns the new kid.
 */
export async function rotateSigningKey(
  db: Database,
  box: SecretBox,
  opts: { propagationMs: number; nowMs?: number },
): Promise<{ kid: string; signFrom: Date; oldKeysExpireAt: Date }> {
  const nowMs = opts.nowMs ?? Date.now()
  const signFrom = new Date(nowMs + opts.propagationMs)
  const key = await newKeyRow(box, new Date(nowMs), signFrom)
  // A process that refreshed just before signFrom switches by signFrom + its refresh interval (<
  // propagationMs); its last token with an old key expires JWT_TTL_S after that.
  const oldKeysExpireAt = new Date(signFrom.getTime() + opts.propagationMs + JWT_TTL_S * 1000)
  await inTransaction(db, (c) => rotateJwtKeys(c, key, oldKeysExpireAt, new Date(nowMs)))
  return { kid: key.kid, signFrom, oldKeysExpireAt }
}

interface CachedToken {
  /** `authorization: Bearer <JWT>\r\n`, as a push writes it. */
  line: string
  sub: string
  aud: string
  /** Used until then: its renewal time, or when the next listed key starts signing if sooner. */
  useUntilMs: number
  /** The signer's generation it was signed in (keys and issuer as then). */
  generation: number
}

/** Options of a JwtSigner. */
export interface JwtSignerOptions {
  db: Queryable
  box: SecretBox
  /** The `iss` claim: HOOKQ_PUBLIC_URL, or the database's recorded one (see broker.ts). */
  issuer: string
  /** Without HOOKQ_PUBLIC_URL: rereads the recorded `iss` with the keys, so a process follows a change. */
  readIssuer?: () => Promise<string | null>
  /** How often the key list is read again, ms. */
  refreshMs: number
  onError?: (err: unknown) => void
  now?: () => number
}

/** Signs push JWTs with the database's current key; one per process. */
export class JwtSigner {
  private keys: JwtKeyRow[] = []
  private readonly privateKeys = new Map<string, Promise<CryptoKey>>()
  private readonly tokens = new Map<string, CachedToken>()
  private readonly signing = new Map<string, { generation: number; promise: Promise<string> }>()
  private timer: NodeJS.Timeout | undefined
  private readonly now: () => number
  private issuer: string
  /** Bumped when a refresh finds other keys or another issuer: cached tokens signed before are not used. */
  private generation = 0
  /** What `generation` was computed from. */
  private signature = ''

  constructor(private readonly opts: JwtSignerOptions) {
    this.now = opts.now ?? Date.now
    this.issuer = opts.issuer
  }

  /** The `iss` this process signs with now. */
  get currentIssuer(): string {
    return this.issuer
  }

  /** Makes the database's first key if it has none, reads the keys, and rereads them every refreshMs. */
  async start(): Promise<void> {
    const nowMs = this.now()
    // The first key of a database signs at once: no verifier can have cached a JWKS without it.
    const first = await newKeyRow(this.opts.box, new Date(nowMs), new Date(nowMs))
    await insertFirstJwtKey(this.opts.db, first)
    await this.refresh()
    this.timer = setInterval(() => {
      this.refresh().catch((err: unknown) => this.opts.onError?.(err))
    }, this.opts.refreshMs)
    this.timer.unref()
  }

  stop(): void {
    clearInterval(this.timer)
  }

  /** Rereads the keys (a rotation made by another process or the CLI). */
  async refresh(): Promise<void> {
    const keys = await listLiveJwtKeys(this.opts.db, new Date(this.now()))
    const issuer = (await this.opts.readIssuer?.()) || this.issuer
    this.setKeys(keys, issuer)
  }

  /** The keys and issuer to sign with (refresh; tests). */
  setKeys(keys: JwtKeyRow[], issuer: string = this.issuer): void {
    this.keys = keys
    this.issuer = issuer
    const signature = `${issuer}\n${keys.map((k) => `${k.kid}@${k.signFrom.getTime()}`).join(',')}`
    if (signature !== this.signature) {
      this.signature = signature
      this.generation++
    }
  }

  /** The key signing at `nowMs` (of those whose signFrom has come, the latest), and when the next one takes over. */
  private current(nowMs: number): { key: JwtKeyRow; untilMs: number } {
    let best: JwtKeyRow | undefined
    let untilMs = Number.POSITIVE_INFINITY
    for (const k of this.keys) {
      const fromMs = k.signFrom.getTime()
      if (fromMs > nowMs) untilMs = Math.min(untilMs, fromMs)
      else if (!best || fromMs >= best.signFrom.getTime()) best = k
    }
    if (!best) throw new Error('no JWT signing key is current (see hookq jwks rotate)')
    return { key: best, untilMs }
  }

  /**
   * `authorization: Bearer <JWT>\r\n` for a push to `consumerId`: the cached token while it has more
   * than a minute to live and its key still signs, else a new one (one signature at a time per consumer).
   */
  authLine(consumerId: string, sub: string, aud: string): string | Promise<string> {
    const nowMs = this.now()
    const cached = this.tokens.get(consumerId)
    if (
      cached !== undefined &&
      nowMs < cached.useUntilMs &&
      cached.generation === this.generation &&
      cached.sub === sub &&
      cached.aud === aud
    )
      return cached.line
    return this.signFor(consumerId, sub, aud, nowMs)
  }

  private signFor(consumerId: string, sub: string, aud: string, nowMs: number): Promise<string> {
    const generation = this.generation
    const pending = this.signing.get(consumerId)
    if (pending && pending.generation === generation) return pending.promise
    const promise = this.sign(sub, aud, nowMs, generation).then(
      (token) => {
        if (this.signing.get(consumerId)?.promise === promise) this.signing.delete(consumerId)
        // Bounded: entries of removed consumers are never asked for again.
        if (this.tokens.size >= 10_000) this.tokens.clear()
        this.tokens.set(consumerId, token)
        return token.line
      },
      (err: unknown) => {
        if (this.signing.get(consumerId)?.promise === promise) this.signing.delete(consumerId)
        throw err
      },
    )
    this.signing.set(consumerId, { generation, promise })
    return promise
  }

  /** Forgets a consumer's token (it answered 401, or it is gone). */
  forget(consumerId: string): void {
    this.tokens.delete(consumerId)
  }

  private async sign(sub: string, aud: string, nowMs: number, generation: number): Promise<CachedToken> {
    const { key, untilMs } = this.current(nowMs)
    const iat = Math.floor(nowMs / 1000)
    const jwt = await new SignJWT({})
      .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: 'JWT' })
      .setIssuer(this.issuer)
      .setSubject(sub)
      .setAudience(aud)
      .setIssuedAt(iat)
      .setExpirationTime(iat + JWT_TTL_S)
      .setJti(randomUUID())
      .sign(await this.privateKey(key))
    // Made flat once here: a push copies it into its request, and a string built of parts is
    // walked part by part on every copy.
    const line = flat(`authorization: Bearer ${jwt}\r\n`)
    return { line, sub, aud, useUntilMs: Math.min((iat + JWT_TTL_S - RENEW_BEFORE_S) * 1000, untilMs), generation }
  }

  private privateKey(key: JwtKeyRow): Promise<CryptoKey> {
    let imported = this.privateKeys.get(key.kid)
    if (!imported) {
      // Opened here, not at refresh: a key this process cannot open fails the pushes it would sign, with the reason.
      imported = (async () => {
        const jwk = JSON.parse(this.opts.box.open(key.privateJwk, placeOf(key.kid))) as JWK
        return (await importJWK(jwk, key.alg)) as CryptoKey
      })()
      imported.catch(() => this.privateKeys.delete(key.kid))
      this.privateKeys.set(key.kid, imported)
    }
    return imported
  }
}

/** `text` as one flat string (V8 keeps a concatenation as its parts until something flattens it). */
function flat(text: string): string {
  return Buffer.from(text, 'latin1').toString('latin1')
}

/**
 * A consumer's push authentication (contract v1.2 "Push authentication") and its secret values at
 * rest: what a POST or PATCH may give, how it is stored (the public part in `auth`, the secret
 * values sealed in `auth_secret`, the signing secrets sealed in `secret` / `previous_secret`), what
 * an answer shows (type, header names, clientId: never a value), and the clear configuration the
 * dispatcher pushes with.
 */
import { HookqError } from '../core/errors.ts'
import { SecretsKeyError, type SecretBox, type SecretPlace } from '../security/secrets.ts'
import type { ConsumerRow } from '../store/groups.ts'
import type { PushAuthConfig } from '../dispatch/push-auth.ts'

/** A POST or PATCH's `auth`, as the schema lets it through. */
export type PushAuthInput = PushAuthConfig

/** Headers at most (the contract's limit). */
export const MAX_AUTH_HEADERS = 20
/** A header name: an RFC 9110 token. */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$/
/** A header value a push can carry as it is: visible ASCII, spaces and tabs inside. */
const HEADER_VALUE = /^[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?$/

/**
 * Header names push authentication may not set: the contract's (content-type, content-length, host,
 * webhook-*), and the request's framing and connection, which a second value would corrupt.
 */
const RESERVED = new Set([
  'content-type',
  'content-length',
  'host',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'upgrade',
  'te',
  'trailer',
  'expect',
])

/** Whether a header name is one push authentication may not set. */
export function reservedHeader(name: string): boolean {
  const n = name.toLowerCase()
  return RESERVED.has(n) || n.startsWith('webhook-')
}

/** Checks what the schema cannot say (reserved names, duplicates by case, values); 400 otherwise, before anything changes. */
export function checkAuth(auth: PushAuthInput, checkTokenUrl: (url: string) => string): PushAuthInput {
  switch (auth.type) {
    case 'headers': {
      const names = Object.keys(auth.headers)
      if (names.length === 0 || names.length > MAX_AUTH_HEADERS) {
        throw new HookqError('invalid_request', `auth.headers must name 1 to ${MAX_AUTH_HEADERS} headers, got ${names.length}`)
      }
      const seen = new Set<string>()
      const headers: Record<string, string> = {}
      for (const name of names) {
        if (!HEADER_NAME.test(name))
          throw new HookqError('invalid_request', `auth.headers: ${JSON.stringify(name.slice(0, 100))} is not a header name`)
        const lower = name.toLowerCase()
        if (reservedHeader(lower)) {
          throw new HookqError(
            'invalid_request',
            `auth.headers may not set ${lower}: content-type, content-length, host, webhook-* and the connection's framing headers are the broker's`,
          )
        }
        if (seen.has(lower)) throw new HookqError('invalid_request', `auth.headers names ${lower} twice`)
        seen.add(lower)
        const value = auth.headers[name]!
        // The value itself is never quoted: it is a secret.
        if (!HEADER_VALUE.test(value) || value.length > 8192) {
          throw new HookqError(
            'invalid_request',
            `auth.headers.${lower}: a value must be 1 to 8192 visible ASCII characters (spaces inside), without line breaks`,
          )
        }
        headers[lower] = value
      }
      return { type: 'headers', headers }
    }
    case 'jwt':
      return auth.audience === undefined ? { type: 'jwt' } : { type: 'jwt', audience: auth.audience }
    case 'oauth2': {
      const tokenUrl = checkTokenUrl(auth.tokenUrl)
      if (!/^[\x20-\x7e]+$/.test(auth.clientId) || !/^[\x20-\x7e]+$/.test(auth.clientSecret)) {
        throw new HookqError('invalid_request', 'auth.clientId and auth.clientSecret must be visible ASCII')
      }
      return {
        type: 'oauth2',
        tokenUrl,
        clientId: auth.clientId,
        clientSecret: auth.clientSecret,
        ...(auth.scope === undefined ? {} : { scope: auth.scope }),
      }
    }
  }
}

/** The public part of an auth as stored in `auth` (no secret value). */
type PublicAuth =
  | { type: 'headers'; names: string[] }
  | { type: 'jwt'; audience?: string }
  | { type: 'oauth2'; tokenUrl: string; clientId: string; scope?: string }

/** Where a consumer's signing secret is sealed (the AAD binds it to its row; both secrets share one field, as a rotation moves one to the other). */
const signingPlace = (id: string): SecretPlace => ({ table: 'consumers', field: 'secret', rowId: id })

/**
 * Where a consumer's auth values are sealed: the row, and where the values are sent (the push URL
 * for headers; for OAuth the push URL, which receives the token, and tokenUrl and clientId, which
 * receive the secret), so that someone who can write the database but
 * lacks the key cannot point a consumer's credentials at another endpoint: they no longer open.
 */
export function authPlace(id: string, url: string, publicAuth: string | null): SecretPlace {
  const a = publicAuth === null ? null : (JSON.parse(publicAuth) as PublicAuth)
  const context =
    a?.type === 'headers'
      ? JSON.stringify(['headers', url])
      : a?.type === 'oauth2'
        ? JSON.stringify(['oauth2', url, a.tokenUrl, a.clientId])
        : JSON.stringify([a?.type ?? null])
  return { table: 'consumers', field: 'auth_secret', rowId: id, context }
}

/** The columns of an auth (null: none) for consumer `id` pushing to `url`, its secret values sealed. */
export function authColumns(
  auth: PushAuthInput | null,
  id: string,
  url: string,
  box: SecretBox,
): { auth: string | null; authSecret: string | null } {
  if (auth === null) return { auth: null, authSecret: null }
  switch (auth.type) {
    case 'headers': {
      const publicAuth = JSON.stringify({ type: 'headers', names: Object.keys(auth.headers) } satisfies PublicAuth)
      return { auth: publicAuth, authSecret: box.seal(JSON.stringify(auth.headers), authPlace(id, url, publicAuth)) }
    }
    case 'jwt':
      return { auth: JSON.stringify(auth satisfies PublicAuth), authSecret: null }
    case 'oauth2': {
      const { clientSecret, ...rest } = auth
      const publicAuth = JSON.stringify(rest satisfies PublicAuth)
      return { auth: publicAuth, authSecret: box.seal(JSON.stringify({ clientSecret }), authPlace(id, url, publicAuth)) }
    }
  }
}

/**
 * A consumer's auth_secret sealed again for a new push URL (PATCH of url alone): headers values
 * are bound to the URL. Unchanged (the same string) when nothing binds it to the URL.
 */
export function resealAuthForUrl(row: Pick<ConsumerRow, 'id' | 'url' | 'auth' | 'authSecret'>, url: string, box: SecretBox): string | null {
  if (row.authSecret === null || url === row.url) return row.authSecret
  const from = authPlace(row.id, row.url, row.auth)
  const to = authPlace(row.id, url, row.auth)
  if (from.context === to.context) return row.authSecret
  return box.seal(box.open(row.authSecret, from), to)
}

/** A signing secret as stored for consumer `id`. */
export function sealSigningSecret(secret: string, id: string, box: SecretBox): string {
  return box.seal(secret, signingPlace(id))
}

/** A stored signing secret in the clear (throws SecretsKeyError). */
export function openSigningSecret(stored: string, id: string, box: SecretBox): string {
  return box.open(stored, signingPlace(id))
}

/** What an answer shows of a consumer's auth: type, header names, tokenUrl, clientId, scope, audience; never a value. */
export function authView(
  c: Pick<ConsumerRow, 'auth'>,
):
  | { type: 'headers'; headerNames: string[] }
  | { type: 'jwt'; audience: string | null }
  | { type: 'oauth2'; tokenUrl: string; clientId: string; scope: string | null }
  | null {
  if (c.auth === null) return null
  const a = JSON.parse(c.auth) as PublicAuth
  switch (a.type) {
    case 'headers':
      return { type: 'headers', headerNames: a.names }
    case 'jwt':
      return { type: 'jwt', audience: a.audience ?? null }
    case 'oauth2':
      return { type: 'oauth2', tokenUrl: a.tokenUrl, clientId: a.clientId, scope: a.scope ?? null }
  }
}

/** A consumer row as the dispatcher pushes with it: signing secrets and auth in the clear. */
export type OpenedConsumer = ConsumerRow & { pushAuth: PushAuthConfig | null; secretsError?: string }

/**
 * The row with its secret values opened. One that cannot be opened (its key is not configured)
 * keeps no secret and carries `secretsError`: its pushes fail with that error, unsent.
 */
export function openConsumer(row: ConsumerRow, box: SecretBox): OpenedConsumer {
  try {
    const secret = row.secret === null ? null : openSigningSecret(row.secret, row.id, box)
    const previousSecret = row.previousSecret === null ? null : openSigningSecret(row.previousSecret, row.id, box)
    return { ...row, secret, previousSecret, pushAuth: openAuth(row, box) }
  } catch (err) {
    if (!(err instanceof SecretsKeyError)) throw err
    return { ...row, secret: null, previousSecret: null, pushAuth: null, secretsError: err.message }
  }
}

function openAuth(row: ConsumerRow, box: SecretBox): PushAuthConfig | null {
  if (row.auth === null) return null
  const a = JSON.parse(row.auth) as PublicAuth
  if (a.type === 'jwt') return a
  const secret = JSON.parse(box.open(row.authSecret ?? '{}', authPlace(row.id, row.url, row.auth))) as Record<string, string>
  if (a.type === 'headers') return { type: 'headers', headers: secret }
  return { ...a, clientSecret: secret.clientSecret ?? '' }
}

/**
 * Push authentication per consumer (contract v1.2 "Push authentication"): the header lines a push
 * carries so the consumer can sit behind the authentication it already has.
 *
 *   headers   static headers, the same on every push
 *   jwt       `authorization: Bearer <JWT>` signed by the broker (jwt-keys.ts)
 *   oauth2    `authorization: Bearer <access_token>` from a client-credentials grant (RFC 6749 §4.4):
 *             one token request at a time per consumer, shared by the pushes waiting for it; the
 *             token reused until shortly before expires_in; dropped when the consumer answers 401
 *             with it, so the next push fetches another (the 401 attempt itself has failed)
 *
 * The consumer rows the dispatcher holds carry `pushAuth` in the clear (GroupService opened it);
 * a row whose secret values could not be opened carries `secretsError` instead, and its pushes
 * fail unsent with that error: never a push signed or authenticated with garbage.
 *
 * Token endpoint failures fail the push as a `network` result whose error names the token endpoint
 * (status, first bytes of its answer, or the timeout): that is what the attempt log records.
 */
import { createPushAgent, push, type AuthedConsumer, type PushAgent, type PushAuthorizer, type PushRequestAuth } from './pusher.ts'
import type { JwtSigner } from './jwt-keys.ts'
import type { UrlPolicy } from '../security/url-policy.ts'

/** A consumer's push authentication with its secret values, as the dispatcher holds it. */
export type PushAuthConfig =
  | { type: 'headers'; headers: Record<string, string> }
  | { type: 'jwt'; audience?: string }
  | { type: 'oauth2'; tokenUrl: string; clientId: string; clientSecret: string; scope?: string }

/** A token endpoint's answer, reused until renewAtMs. */
interface Token {
  lines: string
  renewAtMs: number
  /** The configuration it was fetched with: a changed one (PATCH) fetches anew. */
  config: string
}

/** Options of PushAuth. */
export interface PushAuthOptions {
  signer?: JwtSigner
  /** The push URL policy, applied to token URLs too. */
  policy?: UrlPolicy
  /** A token request's deadline, ms (HOOKQ_OAUTH_TIMEOUT_MS). */
  tokenTimeoutMs: number
  now?: () => number
}

/** A token's lifetime when the endpoint gives no expires_in, s (RFC 6749 leaves it to the client). */
const DEFAULT_EXPIRES_IN_S = 60
/** A token is fetched again this long before it expires, at most, s (and at most half its life). */
const RENEW_BEFORE_S = 30

/** Tokens kept at most, per process. */
const MAX_CACHED = 10_000

/** The push authentication of one broker process: header lines per consumer, tokens cached. */
export class PushAuth implements PushAuthorizer {
  private readonly tokens = new Map<string, Token>()
  private readonly fetching = new Map<string, { config: string; promise: Promise<string> }>()
  private readonly requests = new WeakMap<AuthedConsumer, PushRequestAuth & { group: string }>()
  /** Token requests go out on a client of their own (same URL policy), not queued behind pushes. */
  readonly tokenAgent: PushAgent
  private readonly now: () => number

  constructor(private readonly opts: PushAuthOptions) {
    this.tokenAgent = createPushAgent({ connections: 4, ...(opts.policy ? { policy: opts.policy } : {}) })
    this.now = opts.now ?? Date.now
  }

  /**
   * The authentication of a push to `consumer` of `group`: one object per consumer row, made at its
   * first push, not one per push (it reads the row when asked, so it is the same either way).
   */
  request(consumer: AuthedConsumer, group: string): PushRequestAuth {
    const made = this.requests.get(consumer)
    if (made !== undefined && made.group === group) return made
    const auth = {
      group,
      lines: () => this.lines(consumer, group),
      unauthorized: (lines: string) => this.unauthorized(consumer, lines),
    }
    this.requests.set(consumer, auth)
    return auth
  }

  private lines(c: AuthedConsumer, group: string): string | Promise<string> {
    if (c.secretsError !== undefined) throw new Error(`not pushed: ${c.secretsError}`)
    const auth = c.pushAuth as PushAuthConfig | null | undefined
    if (!auth) return ''
    switch (auth.type) {
      case 'headers':
        return headerLinesOf(auth.headers)
      case 'jwt': {
        if (!this.opts.signer) throw new Error('not pushed: JWT signing is not available in this process')
        return this.opts.signer.authLine(c.id, group, auth.audience ?? c.url)
      }
      case 'oauth2':
        return this.oauthLines(c.id, auth)
    }
  }

  private unauthorized(c: AuthedConsumer, lines: string): void {
    if (c.pushAuth?.type === 'jwt') this.opts.signer?.forget(c.id)
    // Only the token the consumer refused: 100 pushes refused with one token drop it once, and the
    // token fetched after the first 401 is kept.
    if (c.pushAuth?.type === 'oauth2' && this.tokens.get(c.id)?.lines === lines) this.tokens.delete(c.id)
  }

  private oauthLines(consumerId: string, auth: Extract<PushAuthConfig, { type: 'oauth2' }>): string | Promise<string> {
    const config = configOf(auth)
    const token = this.tokens.get(consumerId)
    if (token && token.config === config && token.renewAtMs > this.now()) return token.lines
    const pending = this.fetching.get(consumerId)
    if (pending && pending.config === config) return pending.promise
    const promise = this.fetchToken(auth).then(
      (t) => {
        if (this.fetching.get(consumerId)?.promise === promise) this.fetching.delete(consumerId)
        // Bounded: entries of removed consumers are never asked for again (a clear costs one fetch each).
        if (this.tokens.size >= MAX_CACHED) this.tokens.clear()
        this.tokens.set(consumerId, { ...t, config })
        return t.lines
      },
      (err: unknown) => {
        if (this.fetching.get(consumerId)?.promise === promise) this.fetching.delete(consumerId)
        throw err
      },
    )
    this.fetching.set(consumerId, { config, promise })
    return promise
  }

  /** One client-credentials grant: the client authenticates with HTTP Basic (RFC 6749 §2.3.1). */
  private async fetchToken(auth: Extract<PushAuthConfig, { type: 'oauth2' }>): Promise<Omit<Token, 'config'>> {
    const startMs = this.now()
    const form = new URLSearchParams({ grant_type: 'client_credentials' })
    if (auth.scope) form.set('scope', auth.scope)
    const basic = Buffer.from(`${encodeURIComponent(auth.clientId)}:${encodeURIComponent(auth.clientSecret)}`).toString('base64')
    const r = await push(this.tokenAgent, {
      url: auth.tokenUrl,
      body: form.toString(),
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        accept: 'application/json',
        'user-agent': 'hookq',
        authorization: `Basic ${basic}`,
      },
      timeoutMs: this.opts.tokenTimeoutMs,
      maxResponseBytes: 16_384,
    })
    const where = `OAuth token endpoint ${originOf(auth.tokenUrl)}`
    if (r.kind === 'timeout') throw new Error(`not pushed: ${where} did not answer within ${this.opts.tokenTimeoutMs} ms`)
    if (r.kind === 'network') throw new Error(`not pushed: ${where} unreachable: ${r.error}`)
    // The endpoint's text never goes into the error: it becomes the attempt's error, which consume
    // keys read, and a 2xx body may hold a token. Only an RFC 6749 §5.2 error code is quoted.
    if (r.kind === 'rejected') throw new Error(`not pushed: ${where} answered HTTP ${r.status}${oauthErrorCode(r.body)}`)
    let parsed: { access_token?: unknown; expires_in?: unknown; token_type?: unknown }
    try {
      parsed = JSON.parse(r.body) as typeof parsed
    } catch {
      throw new Error(`not pushed: ${where} answered HTTP ${r.status} without JSON`)
    }
    const accessToken = parsed?.access_token
    // A token that is not a header-safe string would split the push's request: refused.
    if (typeof accessToken !== 'string' || !/^[\x21-\x7e]+$/.test(accessToken)) {
      throw new Error(`not pushed: ${where} answered HTTP ${r.status} without a usable access_token`)
    }
    if (typeof parsed.token_type === 'string' && parsed.token_type.toLowerCase() !== 'bearer') {
      throw new Error(`not pushed: ${where} issued a ${parsed.token_type.slice(0, 40)} token; only bearer tokens are supported`)
    }
    const expiresInS =
      typeof parsed.expires_in === 'number' && Number.isFinite(parsed.expires_in) && parsed.expires_in >= 0
        ? parsed.expires_in
        : DEFAULT_EXPIRES_IN_S
    const renewBeforeS = Math.min(RENEW_BEFORE_S, expiresInS / 2)
    return { lines: `authorization: Bearer ${accessToken}\r\n`, renewAtMs: startMs + (expiresInS - renewBeforeS) * 1000 }
  }

  /** Closes the token client. */
  async close(): Promise<void> {
    await this.tokenAgent.destroy()
  }
}

/** Static headers as header lines (validated on input: names are tokens, values have no line breaks). */
const linesCache = new WeakMap<Record<string, string>, string>()
function headerLinesOf(headers: Record<string, string>): string {
  let lines = linesCache.get(headers)
  if (lines === undefined) {
    lines = ''
    for (const name in headers) lines += `${name}: ${headers[name]!}\r\n`
    linesCache.set(headers, lines)
  }
  return lines
}

/** An OAuth configuration as one string, to tell a changed one (PATCH) from the token's: made once per configuration object, not per push. */
const configs = new WeakMap<object, string>()
function configOf(auth: Extract<PushAuthConfig, { type: 'oauth2' }>): string {
  let config = configs.get(auth)
  if (config === undefined) {
    config = JSON.stringify([auth.tokenUrl, auth.clientId, auth.clientSecret, auth.scope])
    configs.set(auth, config)
  }
  return config
}

function originOf(url: string): string {
  try {
    return new URL(url).origin
  } catch {
    return '(invalid URL)'
  }
}

/**
 * The authentication of a push to `consumer` (undefined: none, the common case, at the cost of
 * two property reads). Without an authorizer on the agent, a consumer that needs one is not pushed to.
 */
export function authOf(agent: PushAgent, consumer: AuthedConsumer, group: string): PushRequestAuth | undefined {
  if (!consumer.pushAuth && consumer.secretsError === undefined) return undefined
  if (agent.authorizer) return agent.authorizer.request(consumer, group)
  return {
    lines: () => {
      throw new Error('not pushed: push authentication is not available in this process')
    },
    unauthorized: () => {},
  }
}

/** `: <code>` for an OAuth error answer's `error` code (RFC 6749 §5.2: ASCII, no spaces), else nothing. */
function oauthErrorCode(body: string): string {
  try {
    const code = (JSON.parse(body) as { error?: unknown })?.error
    return typeof code === 'string' && /^[\x21-\x7e]{1,64}$/.test(code) ? `: ${code}` : ''
  } catch {
    return ''
  }
}

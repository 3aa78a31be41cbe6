/**
 * API keys made with POST /v1/keys: creation, listing, deletion, and the in-memory table every
 * request is checked against.
 *
 * - A key is `hq_` plus 256 random bits (base64url). The database keeps only its SHA-256 digest.
 *   A slow password hash (bcrypt, scrypt, argon2) exists to make guessing a low-entropy secret
 *   expensive; a 256-bit random key cannot be guessed however fast the hash, and SHA-256's
 *   preimage resistance means a copy of the table gives nobody a usable key. A fast hash also lets
 *   the table be an exact lookup (digest → key) instead of one slow hash per request.
 * - Every broker process keeps all keys in memory (digest → record) and never queries the database
 *   for a request. Every REFRESH_MS it reads one row (api_key_version, bumped by a trigger with any
 *   change to the keys) and reloads the keys when it moved. The process that creates or deletes a
 *   key updates its own table at once. Expiry is checked against the clock at each request.
 * - The contract: every process refuses a deleted key within 2 s. The view is as old as the start
 *   of the last read that succeeded (what it saw was true then, not when the answer came); past
 *   MAX_VIEW_AGE_MS (1.8 s: 0.2 s of the 2 s left for a request in progress), stored keys are
 *   refused with 503 rather than trusted: a read that fails or hangs must not let a deleted key
 *   outlive its deletion. Reading every 500 ms leaves a read 1.3 s to answer before a healthy
 *   process refuses anything, and a request that finds the view stale waits (up to 2 s) for a read
 *   of its own before it is refused: only a database that cannot answer makes 503s. Keys from
 *   HOOKQ_API_KEYS do not depend on the database and go on working.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto'
import { HookqError } from '../core/errors.ts'
import { type KeyScope, scopesError } from '../security/access.ts'
import { deleteApiKey, insertApiKey, listApiKeys, readApiKeyVersion, type ApiKeyRow } from '../store/api-keys.ts'
import type { Database } from '../store/db.ts'
import { storableText } from '../store/storable.ts'

/** How often each process looks for changes to the keys. */
const REFRESH_MS = 500
/** A view of the keys older than this is not trusted (stored keys get 503): the contract's 2 s, less a margin. */
export const MAX_VIEW_AGE_MS = 1800
/** How long a request with a stale view waits for a fresh read before its 503. */
const STALE_WAIT_MS = 2000
const KEY_PREFIX = 'hq_'
const MAX_NAME_CHARS = 200

/** The SHA-256 digest of a key's text, as stored. */
export function keyDigest(key: string): Buffer {
  return createHash('sha256').update(key).digest()
}

/** What a request's key may do, as the HTTP layer needs it. */
export interface KeyRecord {
  id: string
  name: string
  scopes: KeyScope[]
  expiresAt: Date | null
}

export interface KeyView {
  id: string
  name: string
  scopes: KeyScope[]
  createdAt: string
  expiresAt: string | null
}

export interface KeyInput {
  name: string
  scopes: KeyScope[]
  expiresAt?: string
}

export function keyView(k: ApiKeyRow): KeyView {
  return {
    id: k.id,
    name: k.name,
    scopes: k.scopes.map(normalScope),
    createdAt: k.createdAt.toISOString(),
    expiresAt: k.expiresAt?.toISOString() ?? null,
  }
}

/** A scope with only the members it has (JSON in, the same JSON out). */
function normalScope(s: KeyScope): KeyScope {
  return { action: s.action, ...(s.topics ? { topics: [...s.topics] } : {}), ...(s.groups ? { groups: [...s.groups] } : {}) }
}

export interface KeyServiceOptions {
  log?: { warn(o: object, m: string): void; error(o: object, m: string): void }
  /** The wall clock (ms since the epoch), for expiry: expiresAt is a wall time. */
  now?: () => number
  /** A monotonic clock (ms), for the view's age: the wall clock jumps (NTP steps, an operator), this one does not. */
  monotonicNow?: () => number
  refreshMs?: number
}

export class KeyService {
  private byDigest = new Map<string, KeyRecord>()
  private version: bigint | undefined
  /** When the read behind the current view started (its snapshot is at least this recent), on the monotonic clock. */
  private viewAtMs = -Infinity
  private timer: NodeJS.Timeout | undefined
  private reading: Promise<void> | undefined
  private stopped = false
  private readonly now: () => number
  private readonly monotonicNow: () => number

  constructor(
    private readonly db: Database,
    private readonly opts: KeyServiceOptions = {},
  ) {
    this.now = opts.now ?? Date.now
    // Not Date.now: a wall clock set back would make an old view look young (a deleted key trusted
    // for as long as the jump), and one set forward would refuse every stored key for no reason.
    this.monotonicNow = opts.monotonicNow ?? (() => performance.now())
  }

  /** Loads the keys and starts looking for changes. */
  async start(): Promise<void> {
    await this.refresh()
    this.schedule()
  }

  stop(): void {
    this.stopped = true
    clearTimeout(this.timer)
  }

  /**
   * The stored key a request presents: its record, 'expired', undefined for none, or 'stale' when
   * the table could not be read for too long to be trusted.
   */
  lookup(key: string): KeyRecord | 'expired' | 'stale' | undefined {
    const record = this.byDigest.get(keyDigest(key).toString('hex'))
    if (!record) return undefined
    if (this.monotonicNow() - this.viewAtMs > MAX_VIEW_AGE_MS) return 'stale'
    if (record.expiresAt !== null && record.expiresAt.getTime() <= this.now()) return 'expired'
    return record
  }

  /**
   * lookup(), but a stale view is read again first (a stalled event loop, a slow read), waiting at
   * most STALE_WAIT_MS for it: a request answered after a fresh read is as sure as the contract asks;
   * 'stale' (503) only when the keys cannot be read now.
   */
  lookupFresh(key: string): ReturnType<KeyService['lookup']> | Promise<ReturnType<KeyService['lookup']>> {
    const found = this.lookup(key)
    if (found !== 'stale') return found
    let timer: NodeJS.Timeout | undefined
    const waited = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, STALE_WAIT_MS)
    })
    // A read in flight may have started before the stall: then one more, started now.
    const fresh = async () => {
      await this.refresh()
      if (this.lookup(key) === 'stale') await this.refresh()
    }
    return Promise.race([fresh(), waited]).then(() => {
      clearTimeout(timer)
      return this.lookup(key)
    })
  }

  /** Makes a key; the key's text is in the answer only. */
  async create(input: KeyInput): Promise<{ view: KeyView; key: string }> {
    const name = input.name.trim()
    if (name === '' || name.length > MAX_NAME_CHARS) {
      throw new HookqError('invalid_request', `name must be 1 to ${MAX_NAME_CHARS} characters`)
    }
    const problem = scopesError(input.scopes)
    if (problem) throw new HookqError('invalid_request', problem)
    let expiresAt: Date | null = null
    if (input.expiresAt !== undefined) {
      const ms = Date.parse(input.expiresAt)
      if (Number.isNaN(ms))
        throw new HookqError('invalid_request', `expiresAt must be an ISO-8601 time, got ${JSON.stringify(input.expiresAt)}`)
      if (ms <= this.now()) throw new HookqError('invalid_request', 'expiresAt must be in the future')
      expiresAt = new Date(ms)
    }
    const key = KEY_PREFIX + randomBytes(32).toString('base64url')
    const row = await insertApiKey(this.db.prisma, {
      id: randomUUID(),
      name: storableText(name, MAX_NAME_CHARS)!,
      keyHash: keyDigest(key),
      scopes: input.scopes.map(normalScope),
      expiresAt,
    })
    await this.afterReadInFlight()
    this.remember(row)
    return { view: keyView(row), key }
  }

  async list(): Promise<KeyView[]> {
    return (await listApiKeys(this.db.prisma)).map(keyView)
  }

  /** Deletes a key; this process refuses it at once, the others within REFRESH_MS and a read. */
  async delete(id: string): Promise<void> {
    if (!(await deleteApiKey(this.db.prisma, id))) throw new HookqError('key_not_found', `API key ${id} does not exist`)
    await this.afterReadInFlight()
    for (const [digest, record] of this.byDigest) if (record.id === id) this.byDigest.delete(digest)
  }

  private remember(row: ApiKeyRow): void {
    const next = new Map(this.byDigest)
    next.set(row.keyHash.toString('hex'), { id: row.id, name: row.name, scopes: row.scopes.map(normalScope), expiresAt: row.expiresAt })
    this.byDigest = next
  }

  /**
   * Before a change made here is applied to the table: a read in flight may have listed the keys
   * before the change committed, and installing its rows after the change would undo it (a key just
   * made answered 401; one just deleted came back until the next read). So that read installs
   * first, the change goes on top, and the next read lists the keys again whatever the version (a
   * key made here and deleted elsewhere meanwhile). A read begun after the commit sees the change.
   */
  private async afterReadInFlight(): Promise<void> {
    await this.reading
    this.version = undefined
  }

  /** Reads the version, and the keys when it moved; one read at a time. */
  refresh(): Promise<void> {
    this.reading ??= this.read().finally(() => {
      this.reading = undefined
    })
    return this.reading
  }

  private async read(): Promise<void> {
    const startedMs = this.monotonicNow()
    try {
      const version = await readApiKeyVersion(this.db.prisma)
      if (version !== this.version) {
        const rows = await listApiKeys(this.db.prisma)
        this.byDigest = new Map(
          rows.map((r) => [
            r.keyHash.toString('hex'),
            { id: r.id, name: r.name, scopes: r.scopes.map(normalScope), expiresAt: r.expiresAt },
          ]),
        )
        this.version = version
      }
      this.viewAtMs = startedMs
    } catch (err) {
      this.opts.log?.error({ err }, 'reading the API keys failed; retrying')
    }
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      void this.refresh().finally(() => this.schedule())
    }, this.opts.refreshMs ?? REFRESH_MS)
    this.timer.unref()
  }
}

/** The work of `hookq secrets rotate` and `hookq jwks rotate` (see secrets.ts), on DATABASE_URL. */
import { ConfigError, loadConfig, type Config } from '../config.ts'
import { rotateSigningKey } from '../dispatch/jwt-keys.ts'
import { SecretBox } from '../security/secrets.ts'
import { resealSecrets } from '../service/secrets-at-rest.ts'
import { openDatabase, type Database } from '../store/db.ts'
import { CliError, EXIT, printJson, printLine } from './output.ts'

/** The default delay between a new JWT key's publication and its first signature: 10 minutes. */
const DEFAULT_PROPAGATION_MS = 600_000

async function withDatabase<T>(fn: (db: Database, box: SecretBox, config: Config) => Promise<T>): Promise<T> {
  let config: Config
  try {
    config = loadConfig()
  } catch (err) {
    if (err instanceof ConfigError) throw new CliError(`configuration error: ${err.message}`, EXIT.usage)
    throw err
  }
  if (!config.databaseUrl) {
    throw new CliError('DATABASE_URL is not set: this command works on the PostgreSQL database of the brokers', EXIT.usage)
  }
  const db = openDatabase(config.databaseUrl, 2)
  try {
    return await fn(db, new SecretBox(config.secretsKey, config.secretsKeysPrevious), config)
  } finally {
    await db.close()
  }
}

/**
 * Seals every stored secret with the current key, then counts again what is not under it; fails
 * when anything remains, saying why. Online (brokers keep writing: a value they change is read
 * again), idempotent (a second run seals nothing) and resumable (stopped half-way, run it again).
 * Prints counts and key ids, never a value.
 */
export async function rotateSecrets(json: boolean): Promise<void> {
  await withDatabase(async (db, box) => {
    if (!box.sealing) throw new CliError('HOOKQ_SECRETS_KEY is not set: there is no key to seal with', EXIT.usage)
    const { sealed, left } = await resealSecrets(db.pool, box)
    const unreadable = Object.fromEntries(left.unreadable)
    if (json)
      printJson({
        kid: box.currentKid,
        sealed,
        remaining: left.remaining,
        unreadable,
        unopenable: left.unopenable,
        pending: left.pending,
      })
    else
      printLine(
        `sealed ${sealed} stored secret value(s) with key ${box.currentKid}; ${left.remaining} remain under another key or in the clear`,
      )
    if (left.remaining === 0) return
    const why = [
      left.unreadable.size > 0 &&
        `${[...left.unreadable].map(([kid, n]) => `${n} sealed with key ${kid}`).join(', ')}, not configured: add it to HOOKQ_SECRETS_KEY_PREVIOUS and run it again`,
      left.unopenable > 0 &&
        `${left.unopenable} that do not authenticate (altered, moved, or their endpoint changed in the database): set those consumers' secrets again`,
      left.pending > 0 && `${left.pending} rewritten by brokers during every pass: run it again`,
    ].filter(Boolean)
    throw new CliError(`${left.remaining} stored secret value(s) are not sealed with key ${box.currentKid}: ${why.join('; ')}`, EXIT.broker)
  })
}

/** Adds a JWT signing key, published now, signing after propagationMs. */
export async function rotateJwks(propagationMs: number | undefined, json: boolean): Promise<void> {
  await withDatabase(async (db, box, config) => {
    const delayMs = propagationMs ?? Math.max(DEFAULT_PROPAGATION_MS, 2 * config.jwtKeysRefreshMs)
    if (delayMs <= config.jwtKeysRefreshMs) {
      throw new CliError(
        `--propagation-ms (${delayMs}) must exceed HOOKQ_JWT_KEYS_REFRESH_MS (${config.jwtKeysRefreshMs}): a process could sign with the key before it is listed`,
        EXIT.usage,
      )
    }
    const r = await rotateSigningKey(db, box, { propagationMs: delayMs })
    const view = { kid: r.kid, signFrom: r.signFrom.toISOString(), previousKeysListedUntil: r.oldKeysExpireAt.toISOString() }
    if (json) printJson(view)
    else
      printLine(
        `new key ${view.kid}: listed now, signs from ${view.signFrom}; the keys it replaces stay listed until ${view.previousKeysListedUntil}`,
      )
  })
}

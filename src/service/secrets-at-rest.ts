/**
 * The secret values at rest as a whole (src/security/secrets.ts seals each one): at start-up, every
 * value must open with a configured key, or the broker refuses to start (it would push unsigned or
 * with garbage); with HOOKQ_SECRETS_KEY set, values in the clear, sealed with a previous key or in
 * the older envelope are sealed again with it by `hookq secrets rotate`, never at start-up (a
 * process not restarted yet, of an older version or without the key, could not open them).
 *
 * The re-seal is online, idempotent and resumable: each value is replaced by a compare-and-set
 * (value and row unchanged since read), so brokers writing meanwhile win and the value is read
 * again on the next pass; a run stopped half-way leaves every value either old or new, both of
 * which open, and the next run goes on. After the passes it counts again what is still not under
 * the current key, and says why.
 */
import { sealedKid, SecretsKeyError, type SecretBox, type SecretPlace } from '../security/secrets.ts'
import type { Queryable } from '../store/db.ts'
import { listStoredSecrets, replaceStoredSecret, type StoredSecret } from '../store/sealed.ts'
import { authPlace } from './consumer-auth.ts'

/** Passes over the values before the re-count: one is enough unless brokers keep rewriting the same values. */
const MAX_PASSES = 5

/** Where a stored value is sealed: its row and column, and for a consumer's auth values, where they are sent. */
function placeOf(s: StoredSecret): SecretPlace {
  if (s.table === 'consumers' && s.column === 'auth_secret') return authPlace(s.rowId, s.url ?? '', s.auth ?? null)
  return { table: s.table, field: s.field, rowId: s.rowId }
}

/** What is not (yet) sealed with the current key, and why. */
export interface SealingLeft {
  /** Values sealed with keys this process does not have: key id → count. */
  unreadable: Map<string, number>
  /** Values under a configured key that do not authenticate (altered, moved, or their endpoint changed in the database). */
  unopenable: number
  /** Values this process could seal but that changed under it on every pass: run again. */
  pending: number
  /** All of them. */
  remaining: number
}

/** Counts the values not under the current key (none without a key: nothing is to be sealed then). */
export async function sealingLeft(q: Queryable, box: SecretBox): Promise<SealingLeft> {
  const left: SealingLeft = { unreadable: new Map(), unopenable: 0, pending: 0, remaining: 0 }
  for (const s of await listStoredSecrets(q)) {
    if (!box.needsReseal(s.value)) continue
    left.remaining++
    const kid = sealedKid(s.value)
    if (kid !== null && !box.hasKey(kid)) left.unreadable.set(kid, (left.unreadable.get(kid) ?? 0) + 1)
    else if (opens(box, s)) left.pending++
    else left.unopenable++
  }
  return left
}

function opens(box: SecretBox, s: StoredSecret): boolean {
  try {
    box.open(s.value, placeOf(s))
    return true
  } catch (err) {
    if (err instanceof SecretsKeyError) return false
    throw err
  }
}

/** Stored values sealed with keys this process does not have: each missing key id and how many values. */
export async function unreadableSecrets(q: Queryable, box: SecretBox): Promise<Map<string, number>> {
  const missing = new Map<string, number>()
  for (const s of await listStoredSecrets(q)) {
    const kid = sealedKid(s.value)
    if (kid !== null && !box.hasKey(kid)) missing.set(kid, (missing.get(kid) ?? 0) + 1)
  }
  return missing
}

/**
 * The start-up check: throws a message a person can act on when some value cannot be opened,
 * naming the keys missing and the key this process has (an old key after a rotation says so).
 */
export async function requireReadableSecrets(q: Queryable, box: SecretBox): Promise<void> {
  const missing = await unreadableSecrets(q, box)
  if (missing.size === 0) return
  const list = [...missing].map(([kid, n]) => `${n} sealed with key ${kid}`).join(', ')
  const current = box.currentKid
  const stored = await listStoredSecrets(q)
  const underCurrent = current === undefined ? 0 : stored.filter((s) => sealedKid(s.value) === current).length
  const have =
    current === undefined
      ? 'HOOKQ_SECRETS_KEY is not set'
      : underCurrent === 0
        ? `HOOKQ_SECRETS_KEY is key ${current}, which seals none of the stored values: this process has only an old key (after \`hookq secrets rotate\`, start it with the new key)`
        : `HOOKQ_SECRETS_KEY is key ${current}`
  throw new Error(
    `stored secrets cannot be opened (${list}); ${have}: set HOOKQ_SECRETS_KEY (or HOOKQ_SECRETS_KEY_PREVIOUS) to the key they were sealed with (docs/security.md "Secrets at rest")`,
  )
}

/**
 * Seals with the current key every value in the clear, sealed with another key or in the older
 * envelope, pass after pass until a pass meets no concurrent write (at most MAX_PASSES); then
 * counts what is left. A value no configured key opens, or that does not authenticate, is left as
 * it is (requireReadableSecrets and the pushes say why).
 */
export async function resealSecrets(q: Queryable, box: SecretBox): Promise<{ sealed: number; left: SealingLeft }> {
  let sealed = 0
  if (box.sealing) {
    for (let pass = 0; pass < MAX_PASSES; pass++) {
      let raced = 0
      for (const s of await listStoredSecrets(q)) {
        if (!box.needsReseal(s.value)) continue
        const kid = sealedKid(s.value)
        if (kid !== null && !box.hasKey(kid)) continue
        const place = placeOf(s)
        let clear: string
        try {
          clear = box.open(s.value, place)
        } catch (err) {
          if (err instanceof SecretsKeyError) continue
          throw err
        }
        if (await replaceStoredSecret(q, s, box.seal(clear, place))) sealed++
        else raced++
      }
      if (raced === 0) break
    }
  }
  return { sealed, left: await sealingLeft(q, box) }
}

/** How many stored values are in the clear (the start-up warning without a key counts them). */
export async function clearSecretCount(q: Queryable): Promise<number> {
  return (await listStoredSecrets(q)).filter((s) => sealedKid(s.value) === null).length
}

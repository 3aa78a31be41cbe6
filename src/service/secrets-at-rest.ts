/**
 * The secret values at rest as a whole (src/security/secrets.ts seals each one): at start-up, every
 * value must open with a configured key, or the broker refuses to start (it would push unsigned or
 * with garbage); with HOOKQ_SECRETS_KEY set, values in the clear or sealed with a previous key are
 * sealed again with it (at every start-up, and by `hookq secrets rotate`).
 */
import { sealedKid, type SecretBox } from '../security/secrets.ts'
import type { Queryable } from '../store/db.ts'
import { listStoredSecrets, replaceStoredSecret } from '../store/sealed.ts'

/** Stored values sealed with keys this process does not have: each missing key id and how many values. */
export async function unreadableSecrets(q: Queryable, box: SecretBox): Promise<Map<string, number>> {
  const missing = new Map<string, number>()
  for (const s of await listStoredSecrets(q)) {
    const kid = sealedKid(s.value)
    if (kid !== null && !box.hasKey(kid)) missing.set(kid, (missing.get(kid) ?? 0) + 1)
  }
  return missing
}

/** The start-up check: throws a message a person can act on when some value cannot be opened. */
export async function requireReadableSecrets(q: Queryable, box: SecretBox): Promise<void> {
  const missing = await unreadableSecrets(q, box)
  if (missing.size === 0) return
  const list = [...missing].map(([kid, n]) => `${n} sealed with key ${kid}`).join(', ')
  const have = box.currentKid ? `HOOKQ_SECRETS_KEY is key ${box.currentKid}` : 'HOOKQ_SECRETS_KEY is not set'
  throw new Error(
    `stored secrets cannot be opened (${list}); ${have}: set HOOKQ_SECRETS_KEY (or HOOKQ_SECRETS_KEY_PREVIOUS) to the key they were sealed with (docs/security.md "Secrets at rest")`,
  )
}

/**
 * Seals with the current key every value in the clear or sealed with another key; returns how many
 * were changed. Each value is replaced only if unchanged meanwhile, so broker processes and the CLI
 * can run it at once. A value no configured key opens is left as it is (requireReadableSecrets says so).
 */
export async function resealSecrets(q: Queryable, box: SecretBox): Promise<number> {
  if (!box.sealing) return 0
  let changed = 0
  for (const s of await listStoredSecrets(q)) {
    if (!box.needsReseal(s.value)) continue
    const kid = sealedKid(s.value)
    if (kid !== null && !box.hasKey(kid)) continue
    const place = { table: s.table, field: s.field, rowId: s.rowId }
    if (await replaceStoredSecret(q, s, box.seal(box.open(s.value, place), place))) changed++
  }
  return changed
}

/** How many stored values are in the clear (the start-up warning without a key counts them). */
export async function clearSecretCount(q: Queryable): Promise<number> {
  return (await listStoredSecrets(q)).filter((s) => sealedKid(s.value) === null).length
}

/** Storage of the keys push JWTs are signed with (see src/dispatch/jwt-keys.ts for their life). */
import type { Queryable } from './db.ts'

/** A jwt_keys row; privateJwk as stored (sealed when a secrets key is set). */
export interface JwtKeyRow {
  kid: string
  alg: string
  publicJwk: string
  privateJwk: string
  publishAt: Date
  signFrom: Date
  expiresAt: Date | null
}

const COLUMNS = `kid, alg, public_jwk AS "publicJwk", private_jwk AS "privateJwk", publish_at AS "publishAt",
  sign_from AS "signFrom", expires_at AS "expiresAt"`

/** Keys not yet expired at `now` (published or about to be), oldest first. */
export async function listLiveJwtKeys(q: Queryable, now: Date): Promise<JwtKeyRow[]> {
  const { rows } = await q.query<JwtKeyRow>(
    `SELECT ${COLUMNS} FROM jwt_keys WHERE expires_at IS NULL OR expires_at > $1 ORDER BY sign_from, kid`,
    [now],
  )
  return rows
}

/** The public keys to list at `now`: published, not expired. */
export async function listPublishedJwtKeys(q: Queryable, now: Date): Promise<{ kid: string; publicJwk: string }[]> {
  const { rows } = await q.query<{ kid: string; publicJwk: string }>(
    `SELECT kid, public_jwk AS "publicJwk" FROM jwt_keys
      WHERE publish_at <= $1 AND (expires_at IS NULL OR expires_at > $1) ORDER BY sign_from, kid`,
    [now],
  )
  return rows
}

/** Adds a key unless a current one (no expiry) exists; true when added (the first key of a database). */
export async function insertFirstJwtKey(q: Queryable, key: JwtKeyRow): Promise<boolean> {
  const { rowCount } = await q.query(
    `INSERT INTO jwt_keys (kid, alg, public_jwk, private_jwk, publish_at, sign_from, expires_at)
     SELECT $1, $2, $3, $4, $5, $6, NULL WHERE NOT EXISTS (SELECT 1 FROM jwt_keys WHERE expires_at IS NULL)`,
    [key.kid, key.alg, key.publicJwk, key.privateJwk, key.publishAt, key.signFrom],
  )
  return (rowCount ?? 0) > 0
}

/**
 * A rotation, in one transaction (`q` is a transaction's client): the keys still current expire at
 * `oldExpireAt`, the new key is added, keys expired for a day are removed.
 */
export async function rotateJwtKeys(q: Queryable, key: JwtKeyRow, oldExpireAt: Date, now: Date): Promise<void> {
  await q.query('UPDATE jwt_keys SET expires_at = $1 WHERE expires_at IS NULL', [oldExpireAt])
  await q.query(
    `INSERT INTO jwt_keys (kid, alg, public_jwk, private_jwk, publish_at, sign_from, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6, NULL)`,
    [key.kid, key.alg, key.publicJwk, key.privateJwk, key.publishAt, key.signFrom],
  )
  await q.query(`DELETE FROM jwt_keys WHERE expires_at < $1::timestamptz - interval '1 day'`, [now])
}

/**
 * The `iss` of this database's push JWTs. With `replace` (HOOKQ_PUBLIC_URL is set) it becomes
 * `issuer`; otherwise the recorded one stays, and `issuer` is recorded only when there is none.
 * Returns what is recorded now, and what was recorded before (null: nothing).
 */
export async function recordJwtIssuer(
  q: Queryable,
  issuer: string,
  replace: boolean,
): Promise<{ issuer: string; previous: string | null }> {
  // The CTE reads the row as it was before this statement's write.
  const { rows } = await q.query<{ issuer: string; previous: string | null }>(
    `WITH before AS (SELECT issuer FROM jwt_issuer WHERE id = 1)
     INSERT INTO jwt_issuer (id, issuer) VALUES (1, $1)
     ON CONFLICT (id) DO UPDATE SET issuer = CASE WHEN $2 THEN EXCLUDED.issuer ELSE jwt_issuer.issuer END,
       recorded_at = CASE WHEN $2 AND jwt_issuer.issuer <> EXCLUDED.issuer THEN now() ELSE jwt_issuer.recorded_at END
     RETURNING issuer, (SELECT issuer FROM before) AS previous`,
    [issuer, replace],
  )
  return rows[0]!
}

/** The recorded `iss`, or null before any broker recorded one. */
export async function readJwtIssuer(q: Queryable): Promise<string | null> {
  const { rows } = await q.query<{ issuer: string }>('SELECT issuer FROM jwt_issuer WHERE id = 1')
  return rows[0]?.issuer ?? null
}

/**
 * Every column that holds a secret value, for the start-up check (is each sealed with a key this
 * process has?) and the re-encryption (seal clear values, and values sealed with an older key, with
 * the current key). See src/security/secrets.ts for the envelope.
 */
import type { Queryable } from './db.ts'

/** A secret column: its table, the column, the row's id column, and the field its AAD names. */
interface SecretColumn {
  table: string
  column: string
  idColumn: string
  /** The AAD's field: the consumer's two signing secrets share one, since a rotation moves one to the other. */
  field: string
  /** Columns the AAD's context is made of (a consumer's auth values: its url and public auth). */
  contextColumns?: { url: string; auth: string }
}

/** The columns that hold secret values. A migration that adds one adds it here. */
export const SECRET_COLUMNS: readonly SecretColumn[] = [
  { table: 'consumers', column: 'secret', idColumn: 'id', field: 'secret' },
  { table: 'consumers', column: 'previous_secret', idColumn: 'id', field: 'secret' },
  { table: 'consumers', column: 'auth_secret', idColumn: 'id', field: 'auth_secret', contextColumns: { url: 'url', auth: 'auth' } },
  { table: 'jwt_keys', column: 'private_jwk', idColumn: 'kid', field: 'private_jwk' },
]

/** One stored secret value and where it is. */
export interface StoredSecret {
  table: string
  column: string
  field: string
  rowId: string
  value: string
  /** The row's url and public auth, for a column whose AAD names them. */
  url?: string
  auth?: string | null
}

/** Every stored secret value, of every secret column (a few per consumer: small tables). */
export async function listStoredSecrets(q: Queryable): Promise<StoredSecret[]> {
  const all: StoredSecret[] = []
  for (const c of SECRET_COLUMNS) {
    const context = c.contextColumns ? `, ${c.contextColumns.url} AS url, ${c.contextColumns.auth} AS auth` : ''
    const { rows } = await q.query<{ rowId: string; value: string; url?: string; auth?: string | null }>(
      `SELECT ${c.idColumn} AS "rowId", ${c.column} AS value${context} FROM ${c.table} WHERE ${c.column} IS NOT NULL`,
    )
    for (const r of rows) all.push({ table: c.table, column: c.column, field: c.field, ...r })
  }
  return all
}

/**
 * Replaces one stored value with `next` if it still holds the value read, and its row the context
 * read (a concurrent write, such as a secret rotation or a new URL, wins); true when it was replaced.
 */
export async function replaceStoredSecret(q: Queryable, s: StoredSecret, next: string): Promise<boolean> {
  const c = SECRET_COLUMNS.find((x) => x.table === s.table && x.column === s.column)
  if (!c) throw new Error(`${s.table}.${s.column} is not a secret column`)
  const params: unknown[] = [next, s.rowId, s.value]
  let unchanged = ''
  if (c.contextColumns) {
    params.push(s.url ?? null, s.auth ?? null)
    unchanged = ` AND ${c.contextColumns.url} IS NOT DISTINCT FROM $4 AND ${c.contextColumns.auth} IS NOT DISTINCT FROM $5`
  }
  const { rowCount } = await q.query(
    `UPDATE ${c.table} SET ${c.column} = $1 WHERE ${c.idColumn} = $2 AND ${c.column} = $3${unchanged}`,
    params,
  )
  return (rowCount ?? 0) > 0
}

/** Storage of the API keys made with POST /v1/keys: their digests and scopes, never the keys. */
import type { KeyScope } from '../security/access.ts'
import type { PrismaExecutor } from './db.ts'

export interface ApiKeyRow {
  id: string
  name: string
  /** SHA-256 of the key. */
  keyHash: Buffer
  scopes: KeyScope[]
  createdAt: Date
  expiresAt: Date | null
}

function toRow(k: { id: string; name: string; keyHash: Uint8Array; scopes: unknown; createdAt: Date; expiresAt: Date | null }): ApiKeyRow {
  return {
    id: k.id,
    name: k.name,
    keyHash: Buffer.from(k.keyHash),
    scopes: k.scopes as KeyScope[],
    createdAt: k.createdAt,
    expiresAt: k.expiresAt,
  }
}

/** Stores a key's digest and scopes. */
export async function insertApiKey(p: PrismaExecutor, key: Omit<ApiKeyRow, 'createdAt'>): Promise<ApiKeyRow> {
  const row = await p.apiKey.create({
    data: {
      id: key.id,
      name: key.name,
      keyHash: new Uint8Array(key.keyHash),
      scopes: key.scopes as never,
      expiresAt: key.expiresAt,
    },
  })
  return toRow(row)
}

/** Every stored key, oldest first. */
export async function listApiKeys(p: PrismaExecutor): Promise<ApiKeyRow[]> {
  return (await p.apiKey.findMany({ orderBy: [{ createdAt: 'asc' }, { id: 'asc' }] })).map(toRow)
}

/** Deletes a key; false when there was none of that id. */
export async function deleteApiKey(p: PrismaExecutor, id: string): Promise<boolean> {
  const { count } = await p.apiKey.deleteMany({ where: { id } })
  return count > 0
}

/** The version a trigger bumps with every change to the keys (0 before any). */
export async function readApiKeyVersion(p: PrismaExecutor): Promise<bigint> {
  const row = await p.apiKeyVersion.findUnique({ where: { id: 1 } })
  return row?.version ?? 0n
}

/**
 * Bearer API keys for every /v1 route when keys are configured. Keys are compared as SHA-256
 * digests with timingSafeEqual, so neither a key's content nor its length leaks through timing.
 */
import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import { HookqError } from '../errors.ts'

const digest = (key: string) => createHash('sha256').update(key).digest()

/** Requires `Authorization: Bearer <key>` on /v1 when `keys` is not empty. */
export function installAuth(app: FastifyInstance, keys: string[]): void {
  if (keys.length === 0) return
  const digests = keys.map(digest)
  app.addHook('onRequest', async (req) => {
    if (!req.url.startsWith('/v1/') && req.url !== '/v1') return
    const header = req.headers.authorization
    const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
    if (match) {
      const given = digest(match[1]!)
      let ok = false
      for (const d of digests) ok = timingSafeEqual(d, given) || ok // no early exit
      if (ok) return
    }
    throw new HookqError('unauthorized', 'send Authorization: Bearer <api key>')
  })
}

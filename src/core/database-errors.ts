/** Recognising database failures that mean "not now" rather than "never". */

const UNAVAILABLE_SQLSTATE = /^(08|57P0[1-3]|53300|40001|40P01)/ // connection, shutdown, too many connections
const UNAVAILABLE_NODE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EAI_AGAIN'])
// Prisma error codes for an unreachable or closed database.
const UNAVAILABLE_PRISMA = new Set(['P1001', 'P1002', 'P1008', 'P1017', 'P2024'])

/**
 * Is this error the database being unreachable or going away (server restart, network, pool
 * exhausted)? Such errors become 503 + Retry-After: the client may retry, nothing was promised.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e && typeof e === 'object' && depth < 5; depth++) {
    const { code, message } = e as { code?: unknown; message?: unknown }
    if (typeof code === 'string') {
      if (UNAVAILABLE_NODE.has(code) || UNAVAILABLE_PRISMA.has(code) || UNAVAILABLE_SQLSTATE.test(code)) return true
    }
    if (
      typeof message === 'string' &&
      /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Cannot use a pool after calling end/i.test(
        message,
      )
    ) {
      return true
    }
    e = (e as { cause?: unknown }).cause
  }
  return false
}

/**
 * Did the connection break after a statement was sent, without an answer from the server? Then a
 * statement that commits on its own may or may not have committed. An error the server sent
 * (it has a SQLSTATE) is an answer: the statement failed and nothing of it was committed.
 */
export function isAnswerLost(err: unknown): boolean {
  const { code, message } = (err ?? {}) as { code?: unknown; message?: unknown }
  if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return false
  if (code === 'ECONNRESET' || code === 'EPIPE' || code === 'ETIMEDOUT') return true
  return typeof message === 'string' && /Connection terminated|connection error/i.test(message)
}

/** A commit whose outcome is unknown: the connection broke before the server answered. */
export class CommitOutcomeUnknown extends Error {
  override name = 'CommitOutcomeUnknown'
  constructor(cause: unknown) {
    super('the database connection broke while committing; the outcome is unknown', { cause })
  }
}

/**
 * Why the broker could not start, in one line a person can act on, as configuration errors are
 * told: the data directory in use, a port taken, a HOST that does not resolve, PostgreSQL not
 * answering. The error itself (with its stack) goes to the log at debug level.
 */
import type { Config } from './config.ts'

/** The one-line reason for `err`, thrown while starting (`stage`: opening the database, or listening). */
export function startupFailure(err: unknown, stage: 'start' | 'listen', config: Pick<Config, 'host' | 'port' | 'databaseUrl'>): string {
  const e = err as NodeJS.ErrnoException & { address?: string; port?: number }
  const code = typeof e?.code === 'string' ? e.code : undefined
  const message = e instanceof Error ? e.message : String(err)
  if (stage === 'listen') {
    const where = `${config.host}:${config.port}`
    switch (code) {
      case 'ENOTFOUND':
      case 'EAI_AGAIN':
        return `HOST ${config.host} does not resolve (${code}): set HOST to an address or a name of this machine`
      case 'EADDRINUSE':
        return `${where} is in use by another process (EADDRINUSE): stop it, or set PORT to another port`
      case 'EADDRNOTAVAIL':
        return `HOST ${config.host} is not an address of this machine (EADDRNOTAVAIL)`
      case 'EACCES':
        return `no permission to listen on ${where} (EACCES): ports below 1024 need privileges; set PORT above 1023`
      default:
        return `cannot listen on ${where}: ${message}`
    }
  }
  if (config.databaseUrl !== undefined) {
    const server = serverOf(config.databaseUrl)
    switch (code) {
      case 'ECONNREFUSED':
        return `PostgreSQL does not answer at ${server} (ECONNREFUSED): is it running? (DATABASE_URL)`
      case 'ENOTFOUND':
      case 'EAI_AGAIN':
        return `the host of DATABASE_URL (${server}) does not resolve (${code})`
      case 'ETIMEDOUT':
        return `PostgreSQL at ${server} did not answer in time (ETIMEDOUT)`
      case undefined:
        break
      default:
        // PostgreSQL's own errors (28P01 password, 3D000 no such database, ...) say it well.
        if (/^[0-9A-Z]{5}$/.test(code)) return `PostgreSQL at ${server} refused: ${message} (${code})`
    }
  }
  return message
}

/** host:port of a postgresql:// URL, without the credentials. */
function serverOf(url: string): string {
  try {
    const u = new URL(url)
    return `${u.hostname || 'localhost'}:${u.port || '5432'}`
  } catch {
    return 'DATABASE_URL'
  }
}

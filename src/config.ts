/** Environment → typed configuration, validated once at start-up with messages a person can act on. */

export interface Config {
  host: string
  port: number
  /** PostgreSQL server; undefined means the embedded database under dataDir. */
  databaseUrl: string | undefined
  dataDir: string
  logLevel: string
  /** Connections in the pg pool (the embedded database takes exactly one; 1 also means a server that takes one). */
  dbPoolSize: number
  /** Largest message (value, key and headers as JSON) accepted by produce. */
  maxMessageBytes: number
  /** Largest request body. */
  maxRequestBytes: number
  /** Messages written by one group-commit transaction at most. */
  commitMaxMessages: number
  /** Group-commit transactions running at once. */
  commitConcurrency: number
  /** Produce backlog (messages waiting for a commit) past which produce answers 503. */
  commitMaxPendingMessages: number
  /** Bytes waiting for a commit past which produce answers 503. */
  commitMaxPendingBytes: number
  /** How often messages past their topic's retention are deleted. */
  retentionIntervalMs: number
  /** Bearer API keys; empty means authentication is off. */
  apiKeys: string[]
  /** How long SIGTERM waits for in-progress work before giving up. */
  shutdownGraceMs: number
}

/** A configuration value that cannot be used; the message names the variable and what it takes. */
export class ConfigError extends Error {
  override name = 'ConfigError'
}

type Env = Record<string, string | undefined>

function int(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (!/^\d+$/.test(raw.trim())) {
    throw new ConfigError(`${name} must be a whole number from ${min} to ${max}, got ${JSON.stringify(raw)}`)
  }
  const value = Number(raw.trim())
  if (value < min || value > max) {
    throw new ConfigError(`${name} must be a whole number from ${min} to ${max}, got ${value}`)
  }
  return value
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']
const MiB = 1024 * 1024

/** Reads the configuration from an environment (process.env by default). Throws ConfigError. */
export function loadConfig(env: Env = process.env): Config {
  const databaseUrl = env.DATABASE_URL?.trim() || undefined
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    throw new ConfigError(`DATABASE_URL must be a postgresql:// URL, got ${JSON.stringify(databaseUrl)}`)
  }
  const logLevel = env.LOG_LEVEL?.trim() || 'info'
  if (!LOG_LEVELS.includes(logLevel)) {
    throw new ConfigError(`LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}, got ${JSON.stringify(logLevel)}`)
  }
  const maxMessageBytes = int(env, 'HOOKQ_MAX_MESSAGE_BYTES', 1 * MiB, 1024, 256 * MiB)
  const maxRequestBytes = int(env, 'HOOKQ_MAX_REQUEST_BYTES', 10 * MiB, 1024, 1024 * MiB)
  if (maxMessageBytes > maxRequestBytes) {
    throw new ConfigError(`HOOKQ_MAX_MESSAGE_BYTES (${maxMessageBytes}) must not exceed HOOKQ_MAX_REQUEST_BYTES (${maxRequestBytes})`)
  }
  return {
    host: env.HOST?.trim() || '127.0.0.1',
    port: int(env, 'PORT', 8080, 0, 65535),
    databaseUrl,
    dataDir: env.HOOKQ_DATA_DIR?.trim() || './data',
    logLevel,
    dbPoolSize: int(env, 'HOOKQ_DB_POOL_SIZE', 10, 1, 1000),
    maxMessageBytes,
    maxRequestBytes,
    commitMaxMessages: int(env, 'HOOKQ_COMMIT_MAX_MESSAGES', 5000, 1, 100_000),
    commitConcurrency: int(env, 'HOOKQ_COMMIT_CONCURRENCY', 1, 1, 64),
    commitMaxPendingMessages: int(env, 'HOOKQ_COMMIT_MAX_PENDING_MESSAGES', 100_000, 1, 10_000_000),
    commitMaxPendingBytes: int(env, 'HOOKQ_COMMIT_MAX_PENDING_BYTES', 256 * MiB, 1024, 64 * 1024 * MiB),
    retentionIntervalMs: int(env, 'HOOKQ_RETENTION_INTERVAL_MS', 60_000, 1000, 86_400_000),
    apiKeys: (env.HOOKQ_API_KEYS ?? '').split(',').map((k) => k.trim()).filter((k) => k.length > 0),
    shutdownGraceMs: int(env, 'HOOKQ_SHUTDOWN_GRACE_MS', 25_000, 0, 3_600_000),
  }
}

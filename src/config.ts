/** Environment → typed configuration, validated once at start-up with messages a person can act on. */
import { availableParallelism } from 'node:os'
import { bool, ConfigError, type Env } from './core/config-values.ts'
export { bool, ConfigError } from './core/config-values.ts'
import { parsePolicy, type UrlPolicy } from './security/url-policy.ts'
import { readFileSync } from 'node:fs'
import { ApiKeySpecError, mergeKeys, parseKeyFile, parseKeyList, type ApiKey } from './http/scopes.ts'
import { parseSecretsKey } from './security/secrets.ts'

export interface Config {
  host: string
  port: number
  /** PostgreSQL server; undefined means the embedded database under dataDir. */
  databaseUrl: string | undefined
  dataDir: string
  logLevel: string
  /** HOOKQ_OTEL: export hookq's spans through OpenTelemetry's Node SDK, set up by the OTEL_* variables (docs/tracing.md). */
  otel: boolean
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
  /**
   * Machine CPU (percent) from which the progress writer waits for company after a full statement
   * (src/dispatch/cpu-load.ts); 0: it always does (for a PostgreSQL on another host, whose CPU this
   * process cannot see).
   */
  lingerCpuPercent: number
  /** Produce backlog (messages waiting for a commit) past which produce answers 503. */
  commitMaxPendingMessages: number
  /** Bytes waiting for a commit past which produce answers 503. */
  commitMaxPendingBytes: number
  /** How often messages past their topic's retention, and attempts past attemptRetentionMs, are deleted. */
  retentionIntervalMs: number
  /** How long an attempt stays in the attempt log (GET /v1/groups/{group}/deliveries), ms (HOOKQ_ATTEMPT_RETENTION_MS). */
  attemptRetentionMs: number
  /** Bearer API keys with their scopes (HOOKQ_API_KEYS and HOOKQ_API_KEYS_FILE); empty means authentication is off. */
  apiKeys: ApiKey[]
  /** Requests a second per API key (per client IP without keys); 0 means no limit. */
  rateLimitPerKey: number
  /** Long polls (pull calls with waitMs) waiting on one process at most (HOOKQ_MAX_WAITING_PULLS); more are answered 429. */
  maxWaitingPulls: number
  /** GET /metrics needs no key even when API keys are configured (HOOKQ_METRICS_OPEN); else a key with the metrics scope. */
  metricsOpen: boolean
  /** How long SIGTERM waits for in-progress work before giving up. */
  shutdownGraceMs: number
  /** Which consumer URLs may be registered and pushed to (HOOKQ_PUSH_* variables; see docs/security.md "Push URL policy"). */
  pushPolicy: UrlPolicy
  /** Concurrent pushes to one consumer: where the adaptive window starts, and its ceiling. */
  pushWindowInitial: number
  pushWindowMax: number
  /** A log line for every request and response (HOOKQ_LOG_REQUESTS). */
  logRequests: boolean
  /** Where the other broker processes on this database reach this one (HOOKQ_ADVERTISE_URL); default: where it listens. */
  advertiseUrl: string | undefined
  /** Broker processes `npm start` runs on the port (HOOKQ_PROCESSES; `auto`: one per core). */
  processes: number
  /**
   * How often each broker process proves its session to the others and rebalances the partitions,
   * ms (HOOKQ_CLUSTER_POLL_MS; HOOKQ_LEADER_POLL_MS, its name before every process pushed, still works).
   */
  clusterPollMs: number
  /**
   * How often the broker looks for messages hookq_produce() committed without being told, ms
   * (HOOKQ_OUTBOX_POLL_MS); several processes take turns. Unset: 5000 where commits are notified
   * (a member session), 50 where they cannot be (the embedded database, a pool of one).
   */
  outboxPollMs: number | undefined
  /** Bytes (values, headers, keys) one move of the outbox takes at most (HOOKQ_OUTBOX_BATCH_BYTES); a larger row moves alone. */
  outboxBatchBytes: number
  /** How old the /metrics lag gauges may grow while someone scrapes, ms (HOOKQ_METRICS_REFRESH_MS). */
  metricsRefreshMs: number
  /** A request's headers and body must arrive within this, ms, or the connection gets 408 and is closed. */
  requestTimeoutMs: number
  /** A request's headers must arrive within this, ms (a new connection that sends nothing is closed after it too). */
  headersTimeoutMs: number
  /** An idle keep-alive connection is closed after this, ms. */
  keepAliveTimeoutMs: number
  /** Seals every secret value before it is stored (HOOKQ_SECRETS_KEY, 32 bytes); none: stored in the clear. */
  secretsKey: Buffer | undefined
  /** Keys that still open values but never seal (HOOKQ_SECRETS_KEY_PREVIOUS, comma-separated), for a key rotation. */
  secretsKeysPrevious: Buffer[]
  /** The broker's public URL, the `iss` of its push JWTs (HOOKQ_PUBLIC_URL); unset: the one recorded in the database. */
  publicUrl: string | undefined
  /** What this process records as the `iss` when HOOKQ_PUBLIC_URL is unset and none is recorded: the advertised URL, else http://HOST:PORT. */
  publicUrlFallback: string
  /** How often each process rereads the JWT signing keys, ms (HOOKQ_JWT_KEYS_REFRESH_MS); a rotation's delay must exceed it. */
  jwtKeysRefreshMs: number
  /** A push auth token request's deadline, ms (HOOKQ_OAUTH_TIMEOUT_MS). */
  oauthTimeoutMs: number
}

/** HOOKQ_SECRETS_KEY and HOOKQ_SECRETS_KEY_PREVIOUS as key bytes. */
function secretsKeys(env: Env): { secretsKey: Buffer | undefined; secretsKeysPrevious: Buffer[] } {
  try {
    const current = env.HOOKQ_SECRETS_KEY?.trim()
    const previous = (env.HOOKQ_SECRETS_KEY_PREVIOUS ?? '')
      .split(',')
      .map((k) => k.trim())
      .filter((k) => k !== '')
    return {
      secretsKey: current ? parseSecretsKey(current, 'HOOKQ_SECRETS_KEY') : undefined,
      secretsKeysPrevious: previous.map((k) => parseSecretsKey(k, 'HOOKQ_SECRETS_KEY_PREVIOUS')),
    }
  } catch (err) {
    throw new ConfigError((err as Error).message)
  }
}

/** HOOKQ_PUBLIC_URL: an http(s) URL, kept as given but a trailing slash. */
function publicUrl(env: Env): string | undefined {
  const raw = env.HOOKQ_PUBLIC_URL?.trim()
  if (!raw) return undefined
  const url = URL.canParse(raw) ? new URL(raw) : undefined
  if (!url || !/^https?:$/.test(url.protocol) || url.username || url.password || url.search || url.hash) {
    throw new ConfigError(
      `HOOKQ_PUBLIC_URL must be an http:// or https:// URL such as https://hookq.example.com, got ${JSON.stringify(raw)}`,
    )
  }
  return raw.replace(/\/+$/, '')
}

/** A configuration value that cannot be used; the message names the variable and what it takes. */

/** HOOKQ_ADVERTISE_URL: an http(s) base URL without a path, query or credentials. */
function advertiseUrl(env: Env): string | undefined {
  const raw = env.HOOKQ_ADVERTISE_URL?.trim()
  if (!raw) return undefined
  const url = URL.canParse(raw) ? new URL(raw) : undefined
  if (
    !url ||
    !/^https?:$/.test(url.protocol) ||
    (url.pathname !== '/' && url.pathname !== '') ||
    url.search ||
    url.username ||
    url.password
  ) {
    throw new ConfigError(
      `HOOKQ_ADVERTISE_URL must be an http:// or https:// base URL such as http://10.0.0.5:8080, got ${JSON.stringify(raw)}`,
    )
  }
  return url.origin
}

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

/** HOOKQ_API_KEYS (`key` or `key:scope+scope`, comma-separated) plus HOOKQ_API_KEYS_FILE (one a line). */
function apiKeys(env: Env): ApiKey[] {
  try {
    const lists = [parseKeyList(env.HOOKQ_API_KEYS ?? '', 'HOOKQ_API_KEYS')]
    const file = env.HOOKQ_API_KEYS_FILE?.trim()
    if (file) {
      let text: string
      try {
        text = readFileSync(file, 'utf8')
      } catch (err) {
        throw new ConfigError(`HOOKQ_API_KEYS_FILE: cannot read ${JSON.stringify(file)}: ${(err as Error).message}`)
      }
      lists.push(parseKeyFile(text, `HOOKQ_API_KEYS_FILE (${file})`))
    }
    return mergeKeys(lists)
  } catch (err) {
    if (err instanceof ApiKeySpecError) throw new ConfigError(err.message)
    throw err
  }
}

function processes(env: Env): number {
  if (env.HOOKQ_PROCESSES?.trim() === 'auto') return availableParallelism()
  return int(env, 'HOOKQ_PROCESSES', 1, 1, 256)
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']
const MiB = 1024 * 1024

/** Reads the configuration from an environment (process.env by default). Throws ConfigError. */
export function loadConfig(env: Env = process.env): Config {
  const databaseUrl = env.DATABASE_URL?.trim() || undefined
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    throw new ConfigError(`DATABASE_URL must be a postgresql:// URL, got ${JSON.stringify(databaseUrl)}`)
  }
  // Prisma's ?schema= would be silently ignored: the tables live in public (see docs/operations.md).
  const schema = databaseUrl === undefined ? null : URL.canParse(databaseUrl) ? new URL(databaseUrl).searchParams.get('schema') : null
  if (schema !== null && schema !== 'public') {
    throw new ConfigError(
      `DATABASE_URL names schema ${JSON.stringify(schema)}: hookq keeps its tables in the public schema; give it a database of its own instead`,
    )
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
  // Server timeouts, so slow or idle clients cannot hold connections for ever (Node's own defaults
  // are 300 s for a request and 60 s for headers, and Fastify turns the request one off):
  // - a request, body included, in 30 s: 10 MiB (the default body limit) at ~3 Mbit/s;
  // - headers in 10 s: they are a few KiB, so only a client dripping them takes longer;
  // - an idle keep-alive connection closes after 5 s, Node's default; behind a load balancer, set
  //   it above the balancer's own idle timeout, or the balancer may reuse a closing connection.
  const requestTimeoutMs = int(env, 'HOOKQ_REQUEST_TIMEOUT_MS', 30_000, 100, 3_600_000)
  const headersTimeoutMs = int(env, 'HOOKQ_HEADERS_TIMEOUT_MS', Math.min(10_000, requestTimeoutMs), 100, 3_600_000)
  if (headersTimeoutMs > requestTimeoutMs) {
    throw new ConfigError(`HOOKQ_HEADERS_TIMEOUT_MS (${headersTimeoutMs}) must not exceed HOOKQ_REQUEST_TIMEOUT_MS (${requestTimeoutMs})`)
  }
  const host = env.HOST?.trim() || '127.0.0.1'
  const port = int(env, 'PORT', 8080, 0, 65535)
  const advertised = advertiseUrl(env)
  return {
    ...secretsKeys(env),
    publicUrl: publicUrl(env),
    publicUrlFallback: advertised?.replace(/\/+$/, '') ?? `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
    jwtKeysRefreshMs: int(env, 'HOOKQ_JWT_KEYS_REFRESH_MS', 60_000, 100, 3_600_000),
    oauthTimeoutMs: int(env, 'HOOKQ_OAUTH_TIMEOUT_MS', 10_000, 100, 120_000),
    host,
    port,
    databaseUrl,
    dataDir: env.HOOKQ_DATA_DIR?.trim() || './data',
    logLevel,
    otel: bool(env, 'HOOKQ_OTEL', false),
    dbPoolSize: int(env, 'HOOKQ_DB_POOL_SIZE', 10, 1, 1000),
    maxMessageBytes,
    maxRequestBytes,
    commitMaxMessages: int(env, 'HOOKQ_COMMIT_MAX_MESSAGES', 5000, 1, 100_000),
    commitConcurrency: int(env, 'HOOKQ_COMMIT_CONCURRENCY', 2, 1, 64),
    lingerCpuPercent: int(env, 'HOOKQ_LINGER_CPU_PERCENT', 90, 0, 100),
    commitMaxPendingMessages: int(env, 'HOOKQ_COMMIT_MAX_PENDING_MESSAGES', 100_000, 1, 10_000_000),
    commitMaxPendingBytes: int(env, 'HOOKQ_COMMIT_MAX_PENDING_BYTES', 256 * MiB, 1024, 64 * 1024 * MiB),
    retentionIntervalMs: int(env, 'HOOKQ_RETENTION_INTERVAL_MS', 60_000, 1000, 86_400_000),
    // At least a minute (the contract's floor): an attempt must outlive its push and the ack of it.
    attemptRetentionMs: int(env, 'HOOKQ_ATTEMPT_RETENTION_MS', 7 * 86_400_000, 60_000, 3650 * 86_400_000),
    apiKeys: apiKeys(env),
    rateLimitPerKey: int(env, 'HOOKQ_RATE_LIMIT_PER_KEY', 0, 0, 1_000_000),
    maxWaitingPulls: int(env, 'HOOKQ_MAX_WAITING_PULLS', 10_000, 1, 1_000_000),
    metricsOpen: bool(env, 'HOOKQ_METRICS_OPEN', false),
    shutdownGraceMs: int(env, 'HOOKQ_SHUTDOWN_GRACE_MS', 25_000, 0, 3_600_000),
    pushPolicy: parsePolicy(env),
    pushWindowInitial: int(env, 'HOOKQ_PUSH_WINDOW_INITIAL', 8, 1, 100_000),
    pushWindowMax: int(env, 'HOOKQ_PUSH_WINDOW_MAX', 1000, 1, 100_000),
    logRequests: bool(env, 'HOOKQ_LOG_REQUESTS', false),
    advertiseUrl: advertised,
    clusterPollMs: int(
      env,
      env.HOOKQ_CLUSTER_POLL_MS === undefined && env.HOOKQ_LEADER_POLL_MS !== undefined ? 'HOOKQ_LEADER_POLL_MS' : 'HOOKQ_CLUSTER_POLL_MS',
      1000,
      50,
      60_000,
    ),
    outboxPollMs: env.HOOKQ_OUTBOX_POLL_MS === undefined ? undefined : int(env, 'HOOKQ_OUTBOX_POLL_MS', 50, 5, 60_000),
    outboxBatchBytes: int(env, 'HOOKQ_OUTBOX_BATCH_BYTES', 16 * MiB, 1024, 256 * MiB),
    metricsRefreshMs: int(env, 'HOOKQ_METRICS_REFRESH_MS', 5000, 10, 600_000),
    processes: processes(env),
    requestTimeoutMs,
    headersTimeoutMs,
    keepAliveTimeoutMs: int(env, 'HOOKQ_KEEP_ALIVE_TIMEOUT_MS', 5000, 100, 3_600_000),
  }
}

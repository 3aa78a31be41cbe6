/**
 * Process entry: configuration, broker, listen, graceful shutdown.
 * SIGTERM/SIGINT stop accepting work, finish the calls in progress and exit 0; a second signal, or
 * a shutdown that outlasts HOOKQ_SHUTDOWN_GRACE_MS, exits 1 at once.
 */
import pino from 'pino'
import { createBroker } from './broker.ts'
import { ConfigError, loadConfig, type Config } from './config.ts'

let config: Config
try {
  config = loadConfig()
} catch (err) {
  if (err instanceof ConfigError) {
    process.stderr.write(`hookq: configuration error: ${err.message}\n`)
    process.exit(2)
  }
  throw err
}

const logger = pino({ level: config.logLevel })
if (config.databaseUrl === undefined) {
  logger.info({ dataDir: config.dataDir }, 'DATABASE_URL is not set: using the embedded database (one process, one connection; see README)')
}
if (config.apiKeys.length === 0) {
  logger.warn('HOOKQ_API_KEYS is not set: the API is open to anyone who can reach it')
}
if (config.pushPolicy.allowPrivate) {
  logger.warn('HOOKQ_PUSH_ALLOW_PRIVATE is true: consumers may be registered on private and loopback addresses; set it to false in production (see README "Push URL policy")')
}

const broker = await createBroker(config, { logger, log: (msg) => logger.info(msg) }).catch((err: unknown) => {
  logger.fatal({ err }, 'start-up failed')
  process.exit(1)
})

let stopping = false
async function shutdown(signal: string): Promise<void> {
  if (stopping) {
    logger.warn({ signal }, 'second signal: exiting now')
    process.exit(1)
  }
  stopping = true
  logger.info({ signal }, 'shutting down: finishing work in progress')
  const timer = setTimeout(() => {
    logger.error({ graceMs: config.shutdownGraceMs }, 'shutdown grace period passed: exiting')
    process.exit(1)
  }, config.shutdownGraceMs)
  timer.unref()
  try {
    await broker.close()
    logger.info('stopped')
    process.exit(0)
  } catch (err) {
    logger.error({ err }, 'shutdown failed')
    process.exit(1)
  }
}
process.on('SIGTERM', () => void shutdown('SIGTERM'))
process.on('SIGINT', () => void shutdown('SIGINT'))

let listening: string
try {
  listening = await broker.app.listen({ host: config.host, port: config.port })
} catch (err) {
  logger.fatal({ err }, `cannot listen on ${config.host}:${config.port}`)
  await broker.close().catch(() => {})
  process.exit(1)
}
// Other broker processes on this database forward acks to the one that pushes: tell them where.
const wildcard = config.host === '0.0.0.0' || config.host === '::'
if (wildcard && config.advertiseUrl === undefined) {
  logger.warn('HOST is a wildcard and HOOKQ_ADVERTISE_URL is not set: if several broker processes share this database, set it so they can forward acks to the one that pushes')
}
await broker.advertise(wildcard ? null : listening)

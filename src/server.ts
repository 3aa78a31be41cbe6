/**
 * Process entry: configuration, broker, listen, graceful shutdown.
 * SIGTERM/SIGINT stop accepting work, finish the calls in progress and exit 0; a second signal, or
 * a shutdown that outlasts HOOKQ_SHUTDOWN_GRACE_MS, exits 1 at once. With HOOKQ_PROCESSES above 1
 * this process becomes the primary of that many broker processes (src/cluster/processes.ts), each
 * of which runs the rest of this file.
 */
import cluster from 'node:cluster'
import net from 'node:net'
import pino from 'pino'
import { createBroker } from './broker.ts'
import { runPrimary } from './cluster/processes.ts'
import { ConfigError, loadConfig, type Config } from './config.ts'
import { startupFailure } from './startup-failure.ts'
import { timerDelayMs } from './core/timer-delay.ts'

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

// A broker process of HOOKQ_PROCESSES advertises its own loopback port (below), never a shared URL.
if (cluster.isWorker) config = { ...config, advertiseUrl: undefined }
const logger = pino({ level: config.logLevel })
// Said once, by the process started: not again by each broker process of HOOKQ_PROCESSES.
if (cluster.isPrimary) {
  if (config.databaseUrl === undefined) {
    logger.info(
      { dataDir: config.dataDir },
      'DATABASE_URL is not set: using the embedded database (one process, one connection; see docs/operations.md)',
    )
    if (config.processes > 1)
      logger.warn(
        { processes: config.processes },
        'HOOKQ_PROCESSES is ignored on the embedded database: it takes one connection, so one process',
      )
  }
  if (config.apiKeys.length === 0) {
    logger.warn('HOOKQ_API_KEYS is not set: the API is open to anyone who can reach it')
  }
  if (config.secretsKey === undefined) {
    logger.warn(
      'HOOKQ_SECRETS_KEY is not set: consumer signing secrets, push auth credentials and JWT signing keys are stored in the clear (see docs/security.md "Secrets at rest")',
    )
  }
  if (config.pushPolicy.allowPrivate) {
    logger.warn(
      'HOOKQ_PUSH_ALLOW_PRIVATE is true: consumers may be registered on private and loopback addresses; set it to false in production (see docs/security.md "Push URL policy")',
    )
  }
  // A port in use (or a HOST that does not resolve) is said now, not after the database has been
  // made and migrated (seconds, on a first start) and the broker built. The processes of
  // HOOKQ_PROCESSES listen on what the one started here checked.
  await canListen(config.host, config.port).catch((err: unknown) => cannotStart(err, 'listen'))
  if (config.processes > 1 && config.databaseUrl !== undefined) {
    if (config.advertiseUrl !== undefined)
      logger.warn('HOOKQ_ADVERTISE_URL is ignored with HOOKQ_PROCESSES: each process advertises a loopback port of its own')
    process.exit(await runPrimary(config.processes, logger))
  }
}

// Before the broker, so its first spans are exported too.
const tracing = config.otel ? await startTracing() : undefined

// Signals count from here: a broker process of HOOKQ_PROCESSES stopped while it is still starting
// (the primary passes SIGTERM on to every process, including one it has just started again) ends
// cleanly once its start-up has, instead of dying to the signal's default action.
// It listens once joined to the others, its share of the partitions loading behind (acks of one being
// loaded wait for it): readiness is the database's and the migrations', not the partitions'.
const starting = createBroker(config, { logger, log: (msg) => logger.info(msg), loadInBackground: true }).catch((err: unknown) =>
  cannotStart(err, 'start'),
)

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
  }, timerDelayMs(config.shutdownGraceMs))
  timer.unref()
  try {
    await (await starting).close()
    // The last spans (the shutdown's own pushes included) are flushed before exit.
    await tracing?.shutdown().catch((err: unknown) => logger.warn({ err }, 'flushing OpenTelemetry spans failed'))
    logger.info('stopped')
    process.exit(0)
  } catch (err) {
    logger.error({ err }, 'shutdown failed')
    process.exit(1)
  }
}
process.on('SIGTERM', () => void shutdown('SIGTERM'))
// A broker process of HOOKQ_PROCESSES leaves SIGINT (a terminal's Ctrl-C reaches the whole process
// group) to the primary, which passes on one SIGTERM: two signals would mean "exit now".
process.on('SIGINT', cluster.isWorker ? () => {} : () => void shutdown('SIGINT'))

const broker = await starting
// Stopped during start-up: shutdown() closes what started and exits; nothing more to open.
if (!stopping) await serve()

async function serve(): Promise<void> {
  let listening: string
  try {
    listening = await broker.app.listen({ host: config.host, port: config.port })
  } catch (err) {
    if (stopping) return // a signal came while listening: shutdown() has closed the server
    await broker.close().catch(() => {})
    cannotStart(err, 'listen')
  }
  // Other broker processes on this database forward acks to the one that pushes: tell them where.
  const wildcard = config.host === '0.0.0.0' || config.host === '::'
  if (wildcard && config.advertiseUrl === undefined) {
    logger.warn(
      'HOST is a wildcard and HOOKQ_ADVERTISE_URL is not set: if several broker processes share this database, set it so they can forward acks to the one that pushes',
    )
  }
  if (cluster.isWorker) {
    // Calls to the shared port land on any process: forwarded ones need this one's own address.
    await broker.advertise(await ownLoopbackPort(broker.app.server))
  } else {
    await broker.advertise(wildcard ? null : listening)
  }
}

/**
 * HOOKQ_OTEL=1: starts OpenTelemetry's Node SDK (`@opentelemetry/sdk-node`, which the user
 * installs: hookq does not depend on it) with no auto-instrumentation, so it exports hookq's spans
 * alone, where the standard OTEL_* variables say (OTLP by default). Missing: a configuration error.
 */
async function startTracing(): Promise<{ shutdown(): Promise<void> }> {
  const name = '@opentelemetry/sdk-node' // a variable: no compile-time dependency on it
  let sdk: { start(): void; shutdown(): Promise<void> }
  try {
    const { NodeSDK } = (await import(name)) as { NodeSDK: new (options: object) => typeof sdk }
    sdk = new NodeSDK({ instrumentations: [] })
  } catch (err) {
    process.stderr.write(
      `hookq: configuration error: HOOKQ_OTEL is set but @opentelemetry/sdk-node cannot be loaded (npm install @opentelemetry/sdk-node): ${err instanceof Error ? err.message : String(err)}\n`,
    )
    process.exit(2)
  }
  sdk.start()
  logger.info('OpenTelemetry tracing is on (HOOKQ_OTEL): spans go where the OTEL_* variables say')
  return sdk
}

/** Ends a start that failed: one line that says why, like a configuration error, and exit 1. */
function cannotStart(err: unknown, stage: 'start' | 'listen'): never {
  logger.debug({ err }, 'start-up failed')
  process.stderr.write(`hookq: cannot start: ${startupFailure(err, stage, config)}\n`)
  process.exit(1)
}

/** Listens on `host`:`port` and stops again: rejects as the broker's own listen would (EADDRINUSE...). */
async function canListen(host: string, port: number): Promise<void> {
  if (port === 0) return // any free port: nothing to be in use
  const probe = net.createServer()
  await new Promise<void>((resolve, reject) => probe.once('error', reject).listen({ host, port, exclusive: true }, resolve))
  await new Promise((resolve) => probe.close(resolve))
}

/** Serves `server`'s connections on a loopback port of this process alone; its URL. */
async function ownLoopbackPort(server: net.Server): Promise<string> {
  const own = net.createServer((socket) => server.emit('connection', socket))
  // exclusive: in a cluster worker, port 0 would otherwise be one port shared by every worker.
  await new Promise<void>((resolve, reject) => own.once('error', reject).listen({ host: '127.0.0.1', port: 0, exclusive: true }, resolve))
  own.unref()
  return `http://127.0.0.1:${(own.address() as net.AddressInfo).port}`
}

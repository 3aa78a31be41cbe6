/**
 * Wires a broker together: database (server or embedded), migrations, stores, services, HTTP app.
 * server.ts runs one; tests run one per test file against their own database.
 */
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { buildApp } from './app.ts'
import type { Config } from './config.ts'
import { GroupCommitter } from './service/group-commit.ts'
import { GroupService } from './service/groups.ts'
import { ProduceService } from './service/produce.ts'
import { ReadService } from './service/read.ts'
import { RetentionSweeper } from './service/retention.ts'
import { TopicService } from './service/topics.ts'
import { openDatabase, type Database } from './store/db.ts'
import { startEmbedded } from './store/embedded.ts'
import { MessageStore, type AppendEntry, type Coordinates } from './store/messages.ts'
import { applyMigrations, pendingMigrations } from './store/migrate.ts'
import { TopicStore } from './store/topics.ts'
import { GroupStore } from './store/groups.ts'

/** What the HTTP routes call. */
export interface Services {
  topics: TopicService
  produce: ProduceService
  read: ReadService
  groups: GroupService
  /** Named checks, each 'ok' or what is wrong. */
  readiness(): Promise<Record<string, string>>
}

export interface Broker {
  app: FastifyInstance
  services: Services
  db: Database
  retention: RetentionSweeper
  /** The database URL in use (the embedded server's when DATABASE_URL is unset). */
  databaseUrl: string
  /** Stops taking requests, finishes those in progress, commits what is queued, closes the database. */
  close(): Promise<void>
}

export interface BrokerOptions {
  logger?: FastifyBaseLogger
  /** Log lines from start-up (migrations, embedded database). */
  log?: (msg: string) => void
}

/** Starts the database side and builds the app (not listening yet). */
export async function createBroker(config: Config, opts: BrokerOptions = {}): Promise<Broker> {
  const log = opts.log ?? (() => {})
  const embedded = config.databaseUrl === undefined
    ? await startEmbedded({ dataDir: config.dataDir, log })
    : undefined
  const databaseUrl = embedded?.connectionString ?? config.databaseUrl!
  // A database that takes one connection at a time (embedded, or a pool size of 1) gets one.
  const singleConnection = embedded !== undefined || config.dbPoolSize === 1
  let db: Database | undefined
  try {
    const { applied } = await applyMigrations(databaseUrl, { log, singleConnection })
    if (applied.length > 0) log(`applied migrations: ${applied.join(', ')}`)
    db = openDatabase(databaseUrl, singleConnection ? 1 : config.dbPoolSize)
    const database = db

    const topicStore = new TopicStore(db.prisma)
    const messageStore = new MessageStore(db)
    const committer = new GroupCommitter<AppendEntry, Coordinates | null>((entries) => messageStore.append(entries), {
      maxBatchMessages: config.commitMaxMessages,
      maxConcurrentCommits: singleConnection ? 1 : config.commitConcurrency,
      maxPendingMessages: config.commitMaxPendingMessages,
      maxPendingBytes: config.commitMaxPendingBytes,
    })
    const topics = new TopicService(topicStore)
    const services: Services = {
      topics,
      produce: new ProduceService(topics, committer, config.maxMessageBytes),
      read: new ReadService(topics, messageStore),
      groups: new GroupService(db, new GroupStore(db.prisma), topicStore),
      async readiness() {
        try {
          const pending = await pendingMigrations((sql) => database.pool.query(sql))
          return { database: 'ok', migrations: pending.length === 0 ? 'ok' : `pending: ${pending.join(', ')}` }
        } catch (err) {
          return { database: `unreachable: ${(err as Error).message}`, migrations: 'unknown' }
        }
      },
    }
    const retention = new RetentionSweeper(db, topicStore, {
      intervalMs: config.retentionIntervalMs,
      sliceRows: 10_000,
      onError: (err) => opts.logger?.error({ err }, 'retention sweep failed; retrying at the next interval'),
      onDeleted: (topic, rows) => opts.logger?.info({ topic, rows }, 'deleted messages past retention'),
    })
    const app = await buildApp({
      services, maxRequestBytes: config.maxRequestBytes, apiKeys: config.apiKeys, logger: opts.logger,
    })

    retention.start()
    let closing: Promise<void> | undefined
    return {
      app, services, db, databaseUrl, retention,
      close() {
        closing ??= (async () => {
          await app.close()
          await retention.stop()
          await committer.drain()
          await database.close()
          await embedded?.close()
        })()
        return closing
      },
    }
  } catch (err) {
    await db?.close().catch(() => {})
    await embedded?.close().catch(() => {})
    throw err
  }
}

/**
 * Wires a broker together: database (server or embedded), migrations, stores, services, HTTP app.
 * server.ts runs one; tests run one per test file against their own database.
 */
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { buildApp } from './app.ts'
import type { Config } from './config.ts'
import { GroupCommitter } from './service/group-commit.ts'
import { GroupService } from './service/groups.ts'
import { AckService } from './service/acks.ts'
import { AttemptLog } from './dispatch/attempt-log.ts'
import { Dispatcher } from './dispatch/dispatcher.ts'
import { CpuLoad, cpuLoadAt } from './dispatch/cpu-load.ts'
import { Cluster } from './cluster/cluster.ts'
import { createPushAgent } from './dispatch/pusher.ts'
import { OutboxMover } from './service/outbox.ts'
import { KeyService } from './service/keys.ts'
import { ProduceService } from './service/produce.ts'
import { ReadService } from './service/read.ts'
import { RetentionSweeper } from './service/retention.ts'
import { ScheduleService } from './service/schedules.ts'
import { ScheduleTicker } from './service/schedule-ticker.ts'
import { TopicService } from './service/topics.ts'
import { autovacuumOff, durabilityWarnings, openDatabase, type Database } from './store/db.ts'
import { appendMessages, partitionKey, type AppendEntry, type Coordinates } from './store/messages.ts'
import { applyMigrations, pendingMigrations } from './store/migrate.ts'
import { readAllLags } from './store/groups.ts'
import { oldestWaitingSeconds } from './store/outbox.ts'
import { Metrics } from './metrics.ts'
import { readStorageStats } from './store/storage.ts'
import { attemptPartitionPlan, maintainAttemptPartitions } from './store/attempt-partitions.ts'
import { maintainMessageChunks, maintainTopicChunks } from './store/message-chunks.ts'
import { OperationsService } from './service/operations.ts'
import type { Services } from './service/services.ts'
import { SecretBox } from './security/secrets.ts'
import { requireReadableSecrets, sealingLeft } from './service/secrets-at-rest.ts'
import { JwksService } from './service/jwks.ts'
import { JwtSigner } from './dispatch/jwt-keys.ts'
import { readJwtIssuer, recordJwtIssuer } from './store/jwt-keys.ts'
import { PushAuth } from './dispatch/push-auth.ts'
import { LAZY_COMPLETION_MS } from './dispatch/progress.ts'

/** What the HTTP routes call. */
export interface Broker {
  app: FastifyInstance
  services: Services
  db: Database
  retention: RetentionSweeper
  /** Moves what hookq_produce() committed into the log (src/service/outbox.ts). */
  outbox: OutboxMover
  /** Makes the schedules' ticks (src/service/schedule-ticker.ts). */
  ticker: ScheduleTicker
  /** The database URL in use (the embedded server's when DATABASE_URL is unset). */
  databaseUrl: string
  /** This process among the broker processes of its database (see src/cluster/ownership.ts). */
  cluster: Cluster
  /** Where the other broker processes reach this one (known once it listens); null: they cannot. */
  advertise(url: string | null): Promise<void>
  /** Stops taking requests, finishes those in progress, commits what is queued, closes the database. */
  close(): Promise<void>
}

export interface BrokerOptions {
  logger?: FastifyBaseLogger
  /** Log lines from start-up (migrations, embedded database). */
  log?: (msg: string) => void
  /**
   * Resolve once this process has joined the others, while its share of the partitions is still
   * being loaded (server.ts: it serves at once; acks of a partition being loaded wait for it).
   * Otherwise once that share is loaded (tests that push right after start).
   */
  loadInBackground?: boolean
}

/** Starts the database side and builds the app (not listening yet). */
export async function createBroker(config: Config, opts: BrokerOptions = {}): Promise<Broker> {
  const log = opts.log ?? (() => {})
  // PGlite is loaded only when it is used: it costs a server-backed broker ~35 MB of RSS otherwise.
  const embedded =
    config.databaseUrl === undefined
      ? await (await import('./store/embedded.ts')).startEmbedded({ dataDir: config.dataDir, log })
      : undefined
  const databaseUrl = embedded?.connectionString ?? config.databaseUrl!
  // A database that takes one connection at a time (embedded, or a pool size of 1) gets one.
  const singleConnection = embedded !== undefined || config.dbPoolSize === 1
  let db: Database | undefined
  let signer: JwtSigner | undefined
  try {
    const { applied } = await applyMigrations(databaseUrl, { log, singleConnection })
    if (applied.length > 0) log(`applied migrations: ${applied.join(', ')}`)
    db = openDatabase(databaseUrl, singleConnection ? 1 : config.dbPoolSize)
    const database = db
    const unsafe = await durabilityWarnings(db.pool)
    if (unsafe.length > 0) {
      const message = embedded
        ? `embedded database: ${unsafe.join(', ')} (PGlite never flushes to disk: a machine crash can lose acknowledged messages; see docs/operations.md)`
        : `PostgreSQL runs with ${unsafe.join(', ')}: a crash can lose messages that produce acknowledged as durably committed`
      if (opts.logger) opts.logger.warn({ settings: unsafe }, message)
      else log(`WARNING: ${message}`)
    }
    // PGlite runs PostgreSQL alone, with no autovacuum: hookq vacuums what its retention deletes there too.
    const noAutovacuum = embedded !== undefined || (await autovacuumOff(db.pool))
    if (!embedded && noAutovacuum) {
      const message =
        'PostgreSQL runs with autovacuum off: hookq vacuums the messages its retention deletes itself (the attempt log needs no vacuum), and its other tables once their dead rows pass autovacuum’s threshold, at each retention sweep (HOOKQ_RETENTION_INTERVAL_MS): other applications’ tables get no vacuum; turn it on (docs/operations.md)'
      if (opts.logger) opts.logger.warn({ settings: ['autovacuum=off'] }, message)
      else log(`WARNING: ${message}`)
    }

    // Secrets at rest (docs/security.md): refuse to start rather than push with secrets this
    // process cannot open. Nothing stored is sealed again here: a re-seal (to the current key, to
    // the current envelope) is `hookq secrets rotate`, run once every process can open what it
    // writes. Done at start-up, the first process of a rolling upgrade, key adoption or key
    // rotation sealed values that the processes not restarted yet cannot open (docs/operations.md).
    const box = new SecretBox(config.secretsKey, config.secretsKeysPrevious)
    await requireReadableSecrets(db.pool, box)
    const left = await sealingLeft(db.pool, box)
    if (left.pending > 0) {
      const message = `${left.pending} stored secret value(s) are in the clear, under a previous key or in an older envelope (hqenc:1): once every broker process runs this version with HOOKQ_SECRETS_KEY key ${box.currentKid}, run \`hookq secrets rotate\` to seal them with it (docs/security.md "Secrets at rest")`
      if (opts.logger) opts.logger.warn({ unsealed: left.pending, kid: box.currentKid }, message)
      else log(`WARNING: ${message}`)
    }
    if (left.unopenable > 0) {
      const message = `${left.unopenable} stored secret value(s) do not authenticate (altered, moved to another row, or their consumer's endpoint changed in the database): those consumers' pushes fail unsent until their secrets are set again`
      if (opts.logger) opts.logger.error({ unopenable: left.unopenable }, message)
      else log(`ERROR: ${message}`)
    }
    // One `iss` per database (docs/security.md "Push authentication"): HOOKQ_PUBLIC_URL, recorded for
    // the processes started without it; without it, the recorded one (the first process's URL). A
    // process with HOOKQ_PUBLIC_URL signs with its own and never rereads it: one whose value differs
    // from the recorded one (another process's) says so, as the two now sign with different iss.
    const { issuer, previous } = await recordJwtIssuer(
      db.pool,
      config.publicUrl ?? config.publicUrlFallback,
      config.publicUrl !== undefined,
    )
    const replaced = config.publicUrl !== undefined && previous !== null && previous !== issuer
    const issuerMessage =
      config.publicUrl === undefined
        ? `HOOKQ_PUBLIC_URL is not set: push JWTs carry iss ${issuer}, recorded in the database by the first broker process (every process of this database signs with it); set HOOKQ_PUBLIC_URL to the URL your consumers verify`
        : replaced
          ? `HOOKQ_PUBLIC_URL ${issuer} replaces the recorded iss ${previous}: push JWTs carry ${issuer} from this process, and from the processes started without HOOKQ_PUBLIC_URL within HOOKQ_JWT_KEYS_REFRESH_MS; a process started with HOOKQ_PUBLIC_URL=${previous}, if any, keeps signing with that until it is restarted (give every process the same HOOKQ_PUBLIC_URL), and consumers that check iss must accept ${issuer}`
          : `push JWTs carry iss ${issuer} (HOOKQ_PUBLIC_URL; recorded for the processes of this database started without it)`
    const level = config.publicUrl !== undefined && !replaced ? 'info' : 'warn'
    if (opts.logger) opts.logger[level]({ issuer, ...(replaced ? { previousIssuer: previous } : {}) }, issuerMessage)
    else log(`${level === 'info' ? '' : 'WARNING: '}${issuerMessage}`)
    signer = new JwtSigner({
      db: db.pool,
      box,
      issuer,
      ...(config.publicUrl === undefined ? { readIssuer: () => readJwtIssuer(database.pool) } : {}),
      refreshMs: config.jwtKeysRefreshMs,
      onError: (err) => opts.logger?.error({ err }, 'reading the JWT signing keys failed; retrying at the next refresh'),
    })
    await signer.start()

    // Commits beside a running one only for partitions it does not hold (group-commit.ts says why).
    // Each append reserves the first pushes the dispatcher (made below) says it may.
    let reserver: Dispatcher | undefined
    const committer = new GroupCommitter<AppendEntry, Coordinates | null>(
      (entries) => appendMessages(database, entries, reserver),
      {
        maxBatchMessages: config.commitMaxMessages,
        maxConcurrentCommits: singleConnection ? 1 : config.commitConcurrency,
        maxPendingMessages: config.commitMaxPendingMessages,
        maxPendingBytes: config.commitMaxPendingBytes,
      },
      (e) => partitionKey(e.topicId, e.partition),
    )
    const topics = new TopicService(db)
    const groups = new GroupService(db, config.pushPolicy, box)
    const logger = opts.logger
    const metrics = new Metrics((err) => logger?.error({ err }, 'reading lag for /metrics failed'), config.metricsRefreshMs)
    // Set below: how many broker processes share the partitions (each process's writers batch a Nth of the load).
    let processes = () => 1
    // Finished attempts wait up to 20 ms for company: the log is history, and fewer, larger inserts
    // cost PostgreSQL and the broker less per row (~10% less CPU per message than at 5 ms; 50 ms
    // saved nothing more). A retry's row does not wait (durable()).
    const attempts = new AttemptLog(db, {
      flushDelayMs: 20,
      maxFlushDelayMs: 100,
      processes: () => processes(),
      holdMs: 1000,
      maxBuffered: 200_000,
      onError: (err, dropped) => logger?.error({ err, dropped }, 'writing the attempt log failed; retrying'),
    })
    const agent = createPushAgent({ policy: config.pushPolicy })
    const pushAuth = new PushAuth({ signer, policy: config.pushPolicy, tokenTimeoutMs: config.oauthTimeoutMs })
    agent.authorizer = pushAuth
    // Set below: the dispatcher tells the cluster of partitions that moved on under it.
    let onMoved: ((name: string, partition: number) => void) | undefined
    const cpuLoad = config.lingerCpuPercent > 0 ? new CpuLoad(cpuLoadAt(config.lingerCpuPercent)) : undefined
    const dispatcher = new Dispatcher({
      db: database,
      attempts,
      agent,
      metrics,
      pushWindow: { initial: config.pushWindowInitial, max: config.pushWindowMax },
      loadGroup: (name) => groups.load(name),
      loadGroups: () => groups.loadAll(),
      ensureOffsets: async (row, topic) => {
        await groups.ensureOffsets(row, topic.id, topic.partitions)
      },
      disableConsumer: (id, reason) => groups.disableConsumer(id, reason),
      log: { warn: (o, m) => logger?.warn(o, m), error: (o, m) => logger?.error(o, m) },
      onMoved: (name, partition) => onMoved?.(name, partition),
      processes: () => processes(),
      ...(cpuLoad ? { cpuBusy: () => cpuLoad.busy() } : {}),
      lazyCompletionMs: LAZY_COMPLETION_MS,
      // No push goes out unless this process can prove it still owns the partition (a stall past its session's end).
      lease: { held: () => cluster.ownership.lease.held(), wait: (fn) => cluster.ownership.lease.wait(fn) },
    })
    reserver = dispatcher
    // Every process on this database pushes the partitions it owns; see src/cluster/ownership.ts.
    const cluster = new Cluster({
      // A database that takes one connection (embedded, or a pool of 1) has room for no session of
      // its own: such a process owns everything alone, as only one process can use that database anyway.
      connectionString: singleConnection ? null : databaseUrl,
      db: database,
      pollMs: config.clusterPollMs,
      dispatcher,
      groupsForTopic: (name) => groups.namesForTopic(name),
      log: { info: (o, m) => logger?.info(o, m), warn: (o, m) => logger?.warn(o, m), error: (o, m) => logger?.error(o, m) },
      onOwned: (count) => metrics.owned(count),
    })
    onMoved = (name, partition) => {
      void cluster.ownership.refresh(name, partition)
    }
    processes = () => cluster.ownership.memberCount
    groups.onChange((name) => cluster.groupChanged(name))
    topics.onChange(async ({ created, deleted }) => {
      if (deleted) await cluster.topicDeleted(deleted.id)
      if (created) await cluster.topicCreated(created.name)
      // A new topic's tree of message chunks before it is answered, so its messages go straight
      // into chunks (failing that, they wait in messages_default and the next sweep files them).
      if (created) {
        await maintainTopicChunks(database.pool, created.id, { sweepIntervalMs: config.retentionIntervalMs, wait: true }).catch(
          (err: unknown) =>
            opts.logger?.warn({ err, topic: created.name }, 'making a new topic’s message chunks failed; the next sweep tries again'),
        )
      }
    })
    const keys = new KeyService(database, { log: { warn: (o, m) => logger?.warn(o, m), error: (o, m) => logger?.error(o, m) } })
    // Stored keys count only when HOOKQ_API_KEYS turns authentication on; said at start-up when some would be ignored.
    if (config.apiKeys.length > 0) await keys.start()
    else {
      const stored = (await keys.list()).length
      if (stored > 0) {
        const message = `${stored} API key(s) made with POST /v1/keys are ignored: HOOKQ_API_KEYS is unset, so the API is open to anyone`
        if (opts.logger) opts.logger.warn({ storedKeys: stored }, message)
        else log(`WARNING: ${message}`)
      }
    }
    const services: Services = {
      topics,
      keys,
      produce: new ProduceService(topics, committer, config.maxMessageBytes),
      read: new ReadService(topics, db),
      groups,
      acks: new AckService(groups, cluster, metrics, config.maxWaitingPulls),
      operations: new OperationsService(db, groups, cluster, attempts, config.attemptRetentionMs),
      schedules: new ScheduleService(db, topics, config.maxMessageBytes),
      metrics,
      jwks: new JwksService(database.pool),
      inFlight: (groupId, partition) => cluster.inFlight(groupId, partition),
      async readiness() {
        try {
          const pending = await pendingMigrations((sql) => database.pool.query(sql))
          return { database: 'ok', migrations: pending.length === 0 ? 'ok' : `pending: ${pending.join(', ')}` }
        } catch (err) {
          return { database: `unreachable: ${(err as Error).message}`, migrations: 'unknown' }
        }
      },
    }
    metrics.trackPartitions(
      () => readAllLags(database.pool),
      (groupId, partition) => cluster.inFlight(groupId, partition),
    )
    metrics.trackPushWindows(() => cluster.pushWindows())
    metrics.trackPullsWaiting(() => services.acks.pullsWaiting)
    metrics.trackOutbox(() => oldestWaitingSeconds(database.pool))
    metrics.trackStorage(() => readStorageStats(database.pool))
    const attemptPartitions = attemptPartitionPlan(config.attemptRetentionMs, config.retentionIntervalMs)
    const retention = new RetentionSweeper(db, {
      intervalMs: config.retentionIntervalMs,
      attemptRetentionMs: config.attemptRetentionMs,
      sliceRows: 10_000,
      onError: (err) => opts.logger?.error({ err }, 'retention sweep failed; retrying at the next interval'),
      onDeleted: (rows) => opts.logger?.info({ rows }, 'deleted messages past retention'),
      onChunkError: (topicId, err) =>
        opts.logger?.warn({ err, topicId }, 'maintaining a topic’s message chunks failed; the next sweep tries again'),
      attemptPartitions,
      vacuumMessages: noAutovacuum,
      onAttemptPartitions: (r) =>
        opts.logger?.debug(
          { created: r.created, dropped: r.dropped, rows: r.droppedRows, kept: r.keptRows },
          'attempt log partitions made and dropped',
        ),
    })
    const app = await buildApp({
      services,
      maxRequestBytes: config.maxRequestBytes,
      apiKeys: config.apiKeys,
      rateLimitPerS: config.rateLimitPerKey,
      metricsOpen: config.metricsOpen,
      logger: opts.logger,
      logRequests: config.logRequests,
      timeouts: { requestMs: config.requestTimeoutMs, headersMs: config.headersTimeoutMs, keepAliveMs: config.keepAliveTimeoutMs },
      ...(singleConnection ? {} : { owners: cluster.ownership }),
    })

    services.produce.onAppend((topicId, partition, endOffset, messages) => cluster.appended(topicId, partition, endOffset, messages))
    const outbox = new OutboxMover({
      db,
      produce: services.produce,
      pollMs: config.outboxPollMs ?? (cluster.hearsOutbox ? 5000 : 50),
      batchRows: config.commitMaxMessages,
      batchBytes: config.outboxBatchBytes,
      onMoved: (topic, n) => metrics.produced(topic, n),
      onSetAside: () => metrics.outboxSetAside(),
      turn: () => cluster.ownership.turn,
      ...(cluster.hearsOutbox ? { waitLock: { take: () => cluster.waitForOutbox(), release: () => cluster.stopWaitingForOutbox() } } : {}),
      log: { warn: (o, m) => logger?.warn(o, m), error: (o, m) => logger?.error(o, m) },
    })
    cluster.onOutboxRows(() => outbox.wake())
    const ticker = new ScheduleTicker({
      db,
      produce: services.produce,
      onProduced: (topic, n) => metrics.produced(topic, n),
      log: { warn: (o, m) => logger?.warn(o, m), error: (o, m) => logger?.error(o, m) },
    })
    services.schedules.onChange(() => ticker.wake())
    // The attempt log's partitions for now and ahead, before the first attempt is written (they are
    // kept ahead by every sweep; a row that finds none waits in the default partition meanwhile).
    await maintainAttemptPartitions(database.pool, {
      nowMs: Date.now(),
      cutoffMs: Date.now() - config.attemptRetentionMs,
      plan: attemptPartitions,
      wait: true,
      lockTimeoutMs: 10_000,
    }).catch((err: unknown) => opts.logger?.warn({ err }, 'making the attempt log partitions failed; the next sweep tries again'))
    // The message chunks of every topic likewise, one topic at a time.
    // Its table locks are waited for briefly and tried again (not 10 s: a waiting exclusive lock
    // request stops the topic's produce and reads behind it); what fails is done at the next sweep.
    const chunks = await maintainMessageChunks(database.pool, {
      sweepIntervalMs: config.retentionIntervalMs,
      wait: true,
    }).catch((err: unknown) => {
      opts.logger?.warn({ err }, 'making the message chunks failed; the next sweep tries again')
      return null
    })
    for (const f of chunks?.failed ?? []) {
      opts.logger?.warn({ err: f.err, topicId: f.topicId }, 'making a topic’s message chunks failed; the next sweep tries again')
    }
    await cluster.start(config.advertiseUrl ?? null, opts.loadInBackground)
    retention.start()
    outbox.start()
    ticker.start()
    let closing: Promise<void> | undefined
    return {
      app,
      services,
      db,
      databaseUrl,
      retention,
      outbox,
      ticker,
      cluster,
      advertise: (url) => cluster.advertise(config.advertiseUrl ?? url),
      close() {
        closing ??= (async () => {
          // Long polls answered first: the server's close waits for every open request.
          dispatcher.answerPulls()
          await app.close()
          keys.stop()
          metrics.close()
          await retention.stop()
          // Before the outbox: the last ticks' messages are moved before it stops (or by the next mover).
          await ticker.stop()
          await outbox.stop()
          await committer.drain()
          await cluster.stop()
          // Pushes still in flight are abandoned: their messages are pushed again after a restart.
          await agent.destroy()
          signer?.stop()
          await pushAuth.close()
          await attempts.close()
          await database.close()
          await embedded?.close()
        })()
        return closing
      },
    }
  } catch (err) {
    signer?.stop()
    await db?.close().catch(() => {})
    await embedded?.close().catch(() => {})
    throw err
  }
}

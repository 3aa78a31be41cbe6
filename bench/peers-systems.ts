/**
 * The systems of bench/peers.ts, each set up fresh for one round: its store (a new database, a
 * RabbitMQ queue, a JetStream stream), its worker process (hookq: the broker) pushing to the sink,
 * the producer's connection details, a check that every message is completed, and its teardown.
 * A set-up that fails half way undoes what it did, so the next system's round runs on a quiet machine.
 * RabbitMQ and NATS are servers the bench finds running (findServer), not ones it starts.
 */
import { execFileSync } from 'node:child_process'
import { connect as netConnect } from 'node:net'
import { AckPolicy, jetstreamManager, RetentionPolicy, StorageType } from '@nats-io/jetstream'
import { connect as natsConnect } from '@nats-io/transport-node'
import amqp from 'amqplib'
import pg from 'pg'
import { brokerApi, startBroker, stopBroker } from './lib/broker.ts'
import { createBenchDatabase } from './lib/db.ts'
import { startIpcWorker } from './lib/ipc.ts'
import { building, run, type Undo } from './lib/run.ts'
import type { ProducerArgs } from './peers-produce.ts'
import type { WorkerArgs } from './peers-worker.ts'

export type PeerSystem = 'hookq' | 'graphile' | 'pgboss' | 'rabbitmq' | 'nats'

export interface SystemConfig {
  serverUrl: string
  amqpUrl: string
  natsUrl: string
  keepDb: boolean
  producers: number
  /** POSTs in flight at most per peer worker. */
  concurrency: number
  /** hookq's topic and group. */
  partitions: number
  maxInFlight: number
  /** The pids of the servers the bench does not start, for their CPU. */
  pids: { rabbitmq?: number | undefined; nats?: number | undefined }
}

export interface Setup {
  /** The process whose CPU is the system's "worker" (hookq: the broker). */
  workerPid: number
  /** Where its messages are stored: PostgreSQL (CPU from bench/lib/proc.ts) or the pid of RabbitMQ's or NATS's server. */
  server: 'postgres' | number
  /** The bench database of this round: PostgreSQL's CPU is its backends' plus the server's shared processes'. */
  database?: string
  producer: ProducerArgs
  /** True once the system has completed `n` messages (completed jobs, committed offsets, acks). */
  completed(n: number): Promise<boolean>
  /** Stops its processes, drops its database or deletes its queue. */
  stop(): Promise<void>
}

/** A fresh database for one system and round, dropped at teardown (unless keepDb). */
async function freshDatabase(cfg: SystemConfig, undo: Undo) {
  // createBenchDatabase also tells the CPU accounting which server's processes are PostgreSQL's.
  const db = await createBenchDatabase(cfg.serverUrl)
  undo.add(() => (cfg.keepDb ? Promise.resolve() : db.drop()))
  return db
}

/** A pg client on `url` for a completion check: `sql` answers one integer `n`. */
async function counter(url: string, sql: string, params: unknown[], undo: Undo): Promise<() => Promise<number>> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  undo.add(() => client.end())
  return async () => (await client.query<{ n: number }>(sql, params)).rows[0]!.n
}

async function worker(args: WorkerArgs, undo: Undo) {
  const w = await startIpcWorker('bench/peers-worker.ts', args, 60_000)
  undo.add(() => w.stop(10_000))
  return w
}

const hookq = (name: string, sinkUrl: string, cfg: SystemConfig) =>
  building<Omit<Setup, 'stop'>>(async (undo) => {
    const db = await freshDatabase(cfg, undo)
    const broker = (run.broker = await startBroker(db.url, { timeoutMs: 90_000 }))
    undo.add(async () => {
      await stopBroker(broker)
      run.broker = undefined
      if (broker.child.exitCode !== 0)
        console.error(`the broker exited with ${broker.child.exitCode ?? broker.child.signalCode}:\n${broker.output()}`)
    })
    const api = <T>(method: string, path: string, body?: unknown) => brokerApi<T>(broker.url, method, path, body)
    await api('PUT', `/v1/topics/${name}`, { partitions: cfg.partitions })
    await api('PUT', `/v1/groups/${name}`, {
      topic: name,
      ackMode: 'auto',
      maxInFlight: cfg.maxInFlight,
      ackTimeoutMs: 30_000,
      pushTimeoutMs: 10_000,
    })
    await api('POST', `/v1/groups/${name}/consumers`, { url: `${sinkUrl}/p/${name}` })
    return {
      workerPid: broker.pid,
      server: 'postgres',
      database: db.name,
      producer: { system: 'hookq', url: broker.url, queue: name, producers: cfg.producers },
      async completed(n) {
        const g = await api<{ partitions: { committedOffset: number }[] }>('GET', `/v1/groups/${name}`)
        return g.partitions.reduce((sum, p) => sum + p.committedOffset, 0) >= n
      },
    }
  })

/** graphile-worker or pg-boss on a database of their own: done once `isDone` says so of the count `sql` answers. */
const onPostgres =
  (system: 'graphile' | 'pgboss', sql: string, isDone: (count: number, n: number) => boolean) =>
  (name: string, sinkUrl: string, cfg: SystemConfig) =>
    building<Omit<Setup, 'stop'>>(async (undo) => {
      const db = await freshDatabase(cfg, undo)
      const w = await worker({ system, url: db.url, sinkUrl: `${sinkUrl}/p/${name}`, queue: name, concurrency: cfg.concurrency }, undo)
      const count = await counter(db.url, sql, system === 'pgboss' ? [name] : [], undo)
      return {
        workerPid: w.pid,
        server: 'postgres',
        database: db.name,
        producer: { system, url: db.url, queue: name, producers: cfg.producers },
        completed: async (n) => isDone(await count(), n),
      }
    })

// Completed jobs are deleted: none left means every job completed (failed ones stay, for their retry).
const graphile = onPostgres('graphile', 'SELECT count(*)::int AS n FROM graphile_worker._private_jobs', (left) => left === 0)
const pgboss = onPostgres(
  'pgboss',
  `SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state = 'completed'`,
  (done, n) => done >= n,
)

const rabbitmq = (name: string, sinkUrl: string, cfg: SystemConfig) =>
  building<Omit<Setup, 'stop'>>(async (undo) => {
    // A durable quorum queue, deleted with whatever it still holds.
    await onAmqp(cfg.amqpUrl, async (c) =>
      (await c.createChannel()).assertQueue(name, { durable: true, arguments: { 'x-queue-type': 'quorum' } }),
    )
    undo.add(async () => {
      const left = await onAmqp(cfg.amqpUrl, async (c) => (await (await c.createChannel()).deleteQueue(name)).messageCount)
      if (left) console.log(`  deleted queue ${name} with ${left} messages in it`)
    })
    return acking('rabbitmq', cfg.amqpUrl, name, sinkUrl, cfg, undo)
  })

const nats = (name: string, sinkUrl: string, cfg: SystemConfig) =>
  building<Omit<Setup, 'stop'>>(async (undo) => {
    // A file-storage work-queue stream (a message removed once acked) and its durable pull consumer
    // (explicit acks, at most `concurrency` unacked), deleted with whatever it still holds.
    await onNats(cfg.natsUrl, async (nc) => {
      const jsm = await jetstreamManager(nc)
      await jsm.streams.add({ name, subjects: [name], storage: StorageType.File, retention: RetentionPolicy.Workqueue })
      await jsm.consumers.add(name, { durable_name: name, ack_policy: AckPolicy.Explicit, max_ack_pending: cfg.concurrency })
    })
    undo.add(async () => {
      const left = await onNats(cfg.natsUrl, async (nc) => {
        const jsm = await jetstreamManager(nc)
        const n = (await jsm.streams.info(name)).state.messages
        await jsm.streams.delete(name)
        return n
      })
      if (left) console.log(`  deleted stream ${name} with ${left} messages in it`)
    })
    return acking('nats', cfg.natsUrl, name, sinkUrl, cfg, undo)
  })

/** The worker of RabbitMQ or NATS on `url`: done once it has acked every message. */
async function acking(system: 'rabbitmq' | 'nats', url: string, name: string, sinkUrl: string, cfg: SystemConfig, undo: Undo) {
  const w = await worker({ system, url, sinkUrl: `${sinkUrl}/p/${name}`, queue: name, concurrency: cfg.concurrency }, undo)
  return {
    workerPid: w.pid,
    server: cfg.pids[system]!,
    producer: { system, url, queue: name, producers: cfg.producers },
    completed: async (n: number) => (await w.call<{ acked: number }>('stats', {}, 5000)).acked >= n,
  }
}

/** Sets `system` up for one round under `name` (database, queue or stream, topic), pushing to `sinkUrl`/p/`name`. */
export function setUp(system: PeerSystem, name: string, sinkUrl: string, cfg: SystemConfig): Promise<Setup> {
  return { hookq, graphile, pgboss, rabbitmq, nats }[system](name, sinkUrl, cfg)
}

/** Runs `fn` on an AMQP connection of its own, closed after it whatever happens. */
async function onAmqp<T>(url: string, fn: (c: amqp.ChannelModel) => Promise<T>): Promise<T> {
  const c = await amqp.connect(url)
  try {
    return await fn(c)
  } finally {
    await c.close()
  }
}

/** Runs `fn` on a NATS connection of its own, closed after it whatever happens. */
async function onNats<T>(url: string, fn: (nc: Awaited<ReturnType<typeof natsConnect>>) => Promise<T>): Promise<T> {
  const nc = await natsConnect({ servers: url })
  try {
    return await fn(nc)
  } finally {
    await nc.close()
  }
}

/** The version a server announces on connecting. */
export const serverVersion = (system: 'rabbitmq' | 'nats', url: string): Promise<string> =>
  system === 'rabbitmq'
    ? onAmqp(url, async (c) => String(c.connection.serverProperties.version ?? '?'))
    : onNats(url, async (nc) => nc.info?.version ?? '?')

/** True if something accepts TCP connections on host:port within a second. */
function reachable(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = netConnect({ host, port })
    const done = (ok: boolean) => {
      socket.destroy()
      resolve(ok)
    }
    socket.setTimeout(1000, () => done(false))
    socket.once('connect', () => done(true))
    socket.once('error', () => done(false))
  })
}

/** The pid of a server the bench does not start (the process listening on its port, from `ss -ltnp`), or why its system is skipped. */
export async function findServer(url: string, defaultPort: number): Promise<{ pid: number } | { skip: string }> {
  const u = new URL(url)
  const port = Number(u.port || defaultPort)
  if (!(await reachable(u.hostname, port))) return { skip: `nothing answers on ${u.hostname}:${port}` }
  let out = ''
  try {
    out = execFileSync('ss', ['-Hltnp', `sport = :${port}`], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
  } catch {
    // no ss here
  }
  const m = /pid=(\d+)/.exec(out)
  return m ? { pid: Number(m[1]) } : { skip: `the process listening on ${port} was not found, so its CPU could not be counted` }
}

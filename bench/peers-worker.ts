/**
 * The push workers of bench/peers.ts, one process per system and round: each takes messages from
 * its system and POSTs each one's JSON to the sink as it is, through a keep-alive undici Agent with
 * one socket per push in flight and no pipelining, as hookq's pusher does. A message is completed
 * or acked only after the sink's 2xx (at least once, like hookq's ackMode auto); at most
 * `concurrency` POSTs are in flight.
 *
 *   graphile  graphile-worker's runner with one task that throws unless the sink answered 2xx.
 *             Settings from its performance page (worker.graphile.org/docs/performance), with
 *             concurrentJobs `concurrency` instead of its 24: localQueue 500 (jobs fetched and locked
 *             in batches), completeJobBatchDelay and failJobBatchDelay 0 (a tick's completions in one
 *             statement), maxPoolSize 10 (the default: pools of 10, 25 and 100 measured alike here,
 *             20,000 messages, two runs each: 4,800-6,000 msg/s and 91-113 us of PostgreSQL CPU per
 *             message for each; "concurrentJobs + 2" would pass the server's max_connections of 100)
 *   pgboss    pg-boss 12's work() with batchSize `concurrency` and localConcurrency 1 (one loop of full
 *             fetches beat 2 × 50 and 4 × 25 here, docs/performance.md), perJobResults (each job settled by its own push),
 *             burstWhenBatchFull, and LISTEN/NOTIFY wake-ups (useListenNotify, queue notify); the rest
 *             at its defaults, as a user would run it
 *   rabbitmq  an amqplib channel on the bench's quorum queue, prefetch `concurrency`, manual acks; a
 *             failed push nacked back onto the queue after 100 ms
 *   nats      JetStream's durable pull consumer (max_ack_pending `concurrency`, set by peers-systems.ts);
 *             a failed push nak'ed for redelivery after 100 ms
 *
 * Driven over IPC (bench/lib/ipc.ts): `ready` once consuming; `stats` answers the pushes made (and
 * the acks sent, for RabbitMQ and NATS). SIGTERM stops the worker gracefully.
 *
 * argv[2]: JSON { system, url (the database's, the AMQP or NATS server's), sinkUrl, queue, concurrency }
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { jetstream } from '@nats-io/jetstream'
import { connect } from '@nats-io/transport-node'
import amqp from 'amqplib'
import { Logger, run } from 'graphile-worker'
import { PgBoss } from 'pg-boss'
import { Agent } from 'undici'
import { serveIpc } from './lib/ipc.ts'

export interface WorkerArgs {
  system: 'graphile' | 'pgboss' | 'rabbitmq' | 'nats'
  url: string
  sinkUrl: string
  /** graphile: the task identifier; pg-boss and RabbitMQ: the queue; NATS: the stream and its durable consumer. */
  queue: string
  concurrency: number
}

const args = JSON.parse(process.argv[2] ?? '{}') as WorkerArgs

const sink = new URL(args.sinkUrl)
const agent = new Agent({ connections: args.concurrency, pipelining: 1, keepAliveTimeout: 4_000 })
const counts = { ok: 0, failed: 0, acked: 0, nacked: 0 }
/** POSTs `body` (JSON) to the sink; true on a 2xx, false on another status or a network error. */
async function post(body: string | Uint8Array): Promise<boolean> {
  try {
    const res = await agent.request({
      origin: sink.origin,
      path: sink.pathname,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    })
    await res.body.dump()
    const ok = res.statusCode >= 200 && res.statusCode < 300
    counts[ok ? 'ok' : 'failed']++
    return ok
  } catch (err) {
    if (++counts.failed <= 3) console.error('push failed:', err instanceof Error ? err.message : err)
    return false
  }
}
/** Acks a message after a 2xx, else nacks it after 100 ms. */
async function settle(ok: boolean, ack: () => void, nack: () => void): Promise<void> {
  if (!ok) await sleep(100)
  ;(ok ? ack : nack)()
  counts[ok ? 'acked' : 'nacked']++
}

/** Starts consuming; answers how to stop. */
const workers: Record<WorkerArgs['system'], () => Promise<() => Promise<unknown>>> = {
  async graphile() {
    const runner = await run({
      // Only warnings and errors: one line per completed job otherwise (hookq runs with LOG_LEVEL=warn).
      logger: new Logger(() => (level, message) => {
        if (level === 'error' || level === 'warning') console.error(`graphile-worker ${level}: ${message}`)
      }),
      noHandleSignals: true,
      taskList: {
        [args.queue]: async (payload) => {
          if (!(await post(JSON.stringify(payload)))) throw new Error('the sink did not answer 2xx')
        },
      },
      preset: {
        worker: {
          connectionString: args.url,
          concurrentJobs: args.concurrency,
          maxPoolSize: 10,
          localQueue: { size: 500 },
          completeJobBatchDelay: 0,
          failJobBatchDelay: 0,
        },
      },
    })
    return () => runner.stop()
  },
  async pgboss() {
    const boss = new PgBoss({ connectionString: args.url, useListenNotify: true })
    boss.on('error', (err: unknown) => console.error('pg-boss (worker):', err))
    await boss.start()
    await boss.createQueue(args.queue, { notify: true })
    const options = { batchSize: args.concurrency, localConcurrency: 1, perJobResults: true, burstWhenBatchFull: true }
    await boss.work<object>(args.queue, options, (jobs) =>
      Promise.all(
        jobs.map(async (job) => ({
          id: job.id,
          status: (await post(JSON.stringify(job.data))) ? ('completed' as const) : ('failed' as const),
        })),
      ),
    )
    return () => boss.stop({ graceful: true, timeout: 5_000 })
  },
  async rabbitmq() {
    const conn = await amqp.connect(args.url)
    const ch = await conn.createChannel()
    await ch.prefetch(args.concurrency)
    const { consumerTag } = await ch.consume(args.queue, (msg) => {
      // null: the queue was deleted
      if (msg)
        void post(msg.content).then((ok) =>
          settle(
            ok,
            () => ch.ack(msg),
            () => ch.nack(msg, false, true),
          ),
        )
    })
    return () => ch.cancel(consumerTag).then(() => conn.close())
  },
  async nats() {
    const nc = await connect({ servers: args.url })
    const consumer = await jetstream(nc).consumers.get(args.queue, args.queue)
    const messages = await consumer.consume({
      max_messages: args.concurrency,
      callback: (m) =>
        void post(m.data).then((ok) =>
          settle(
            ok,
            () => m.ack(),
            () => m.nak(),
          ),
        ),
    })
    return () => messages.close().then(() => nc.drain())
  },
}

const stop = await workers[args.system]()
serveIpc({ stats: () => ({ ...counts }) }, { pid: process.pid })
process.on('SIGTERM', () => {
  void stop()
    .then(() => agent.close())
    .finally(() => process.exit(0))
})

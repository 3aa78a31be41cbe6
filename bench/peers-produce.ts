/**
 * The producer process of bench/peers.ts, one per system and round, separate from the worker (or
 * broker) it feeds. Driven over IPC (bench/lib/ipc.ts): `produce` sends `total` messages in
 * batches of `batch` from `producers` concurrent loops, as fast as the system accepts them, each
 * batch to the system's own batch API:
 *
 *   hookq     POST /v1/topics/{t}/messages with `batch` messages (as bench/e2e-load.ts's bulk)
 *   graphile  WorkerUtils.addJobs (one graphile_worker.add_jobs call) of `batch` jobs
 *   pgboss    PgBoss.insert of `batch` jobs (one statement)
 *   rabbitmq  `batch` persistent publishes on the loop's confirm channel, then waitForConfirms
 *   nats      `batch` JetStream publishes at once, then all their acks (the stream has stored each)
 *
 * Every message value is bench/lib/batches.ts's MESSAGE_VALUE plus its batch's send time `t`
 * (wall-clock ms, for the receiver's produce-to-push latency). For the peers the job (or AMQP body)
 * is the JSON the worker POSTs as it is: {"partition":0,"offset":<n>,"value":…}, n numbering the
 * messages 0…total-1, so the receiver counts each once and sees duplicates as it does for hookq's
 * envelopes. A failed batch is sent again (up to 5 times). Bounded in count and in time (maxSeconds).
 *
 * argv[2]: JSON { system, url, queue } (url: the broker's, the database's or the AMQP server's)
 */
import { once } from 'node:events'
import { jetstream } from '@nats-io/jetstream'
import { connect as natsConnect } from '@nats-io/transport-node'
import amqp from 'amqplib'
import { makeWorkerUtils } from 'graphile-worker'
import { PgBoss } from 'pg-boss'
import { hookqSender as hookqBatches, MESSAGE_VALUE, type SendBatch, sendBatches } from './lib/batches.ts'
import { serveIpc } from './lib/ipc.ts'

export type ProducerSystem = 'hookq' | 'graphile' | 'pgboss' | 'rabbitmq' | 'nats'
export interface ProducerArgs {
  system: ProducerSystem
  url: string
  /** hookq: the topic; graphile: the task identifier; pg-boss and RabbitMQ: the queue; NATS: the stream's subject. */
  queue: string
  producers: number
}
export interface ProduceArgs {
  total: number
  batch: number
  maxSeconds: number
}

const args = JSON.parse(process.argv[2] ?? '{}') as ProducerArgs

/** Sends messages first…first+n-1 of the run as one batch from loop `loop`; throws when the system refused it. */
interface Sender {
  /** One batch through the system's batch API (see SendBatch: a wait in ms when refused for now). */
  send: SendBatch
  close(): Promise<void>
}

/** The job of a peer: the body its worker POSTs. */
const job = (offset: number, sentAt: number) => ({ partition: 0, offset, value: { ...MESSAGE_VALUE, t: sentAt } })

async function hookqSender(): Promise<Sender> {
  return hookqBatches(args.url, args.queue, args.producers)
}

async function graphileSender(): Promise<Sender> {
  const utils = await makeWorkerUtils({ connectionString: args.url, maxPoolSize: Math.max(2, args.producers) })
  return {
    async send(_loop, first, n, sentAt) {
      await utils.addJobs(Array.from({ length: n }, (_, k) => ({ identifier: args.queue, payload: job(first + k, sentAt) })))
    },
    async close() {
      await utils.release()
    },
  }
}

async function pgbossSender(): Promise<Sender> {
  // Only inserts here: no maintenance, no cron, no migration (the worker process installed the schema).
  const boss = new PgBoss({ connectionString: args.url, max: args.producers, supervise: false, schedule: false, migrate: false })
  boss.on('error', (err: unknown) => console.error('pg-boss (producer):', err))
  await boss.start()
  return {
    async send(_loop, first, n, sentAt) {
      await boss.insert(
        args.queue,
        Array.from({ length: n }, (_, k) => ({ data: job(first + k, sentAt) })),
      )
    },
    close: () => boss.stop({ graceful: false }),
  }
}

async function rabbitSender(): Promise<Sender> {
  const conn = await amqp.connect(args.url)
  // One confirm channel per producer loop, so that each loop waits for its own batch's confirms.
  const channels = await Promise.all(Array.from({ length: args.producers }, () => conn.createConfirmChannel()))
  return {
    async send(loop, first, n, sentAt) {
      const ch = channels[loop]!
      for (let k = 0; k < n; k++) {
        const body = Buffer.from(JSON.stringify(job(first + k, sentAt)))
        if (!ch.sendToQueue(args.queue, body, { persistent: true, contentType: 'application/json' })) await once(ch, 'drain')
      }
      await ch.waitForConfirms()
    },
    async close() {
      await conn.close()
    },
  }
}

async function natsSender(): Promise<Sender> {
  const nc = await natsConnect({ servers: args.url })
  const js = jetstream(nc)
  return {
    async send(_loop, first, n, sentAt) {
      await Promise.all(Array.from({ length: n }, (_, k) => js.publish(args.queue, JSON.stringify(job(first + k, sentAt)))))
    },
    close: () => nc.close(),
  }
}

const sender = await { hookq: hookqSender, graphile: graphileSender, pgboss: pgbossSender, rabbitmq: rabbitSender, nats: natsSender }[
  args.system
]()

let failures = 0
async function produce(a: ProduceArgs) {
  return sendBatches(
    { total: a.total, batch: a.batch, loops: args.producers, maxSeconds: a.maxSeconds },
    (loop, first, n, sentAt) => sender.send(loop, first, n, sentAt),
    (err, attempt) => {
      if (++failures <= 3)
        console.error(`peers-produce (${args.system}): batch failed (attempt ${attempt}):`, err instanceof Error ? err.message : err)
    },
  )
}
export type ProduceResult = Awaited<ReturnType<typeof produce>>

serveIpc({ produce, close: () => sender.close() } as Record<string, (a: never) => unknown>, { pid: process.pid })
process.on('SIGTERM', () => process.exit(0))

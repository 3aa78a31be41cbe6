/**
 * The RabbitMQ push worker of bench/peers.ts: one amqplib connection and channel consuming the
 * bench's quorum queue (declared by bench/peers.ts) with manual acks and prefetch `concurrency`
 * (so at most that many messages unacked, i.e. POSTs in flight, like hookq's maxInFlight). Each
 * message's body is POSTed to the sink as it is (bench/lib/push.ts); the message is acked after a
 * 2xx, else nacked back onto the queue (after 100 ms, so a failing sink is not hammered).
 *
 * Driven over IPC (bench/lib/ipc.ts): `ready` once consuming; `stats` answers the pushes made and
 * the acks sent. SIGTERM cancels the consumer and closes the connection.
 *
 * argv[2]: JSON { amqpUrl, sinkUrl, queue, concurrency }
 */
import { setTimeout as sleep } from 'node:timers/promises'
import amqp from 'amqplib'
import { serveIpc } from './lib/ipc.ts'
import { makePusher } from './lib/push.ts'

const args = JSON.parse(process.argv[2] ?? '{}') as { amqpUrl: string; sinkUrl: string; queue: string; concurrency: number }

const pusher = makePusher(args.sinkUrl, args.concurrency)
const conn = await amqp.connect(args.amqpUrl)
const ch = await conn.createChannel()
await ch.prefetch(args.concurrency)
let acked = 0
let nacked = 0
const { consumerTag } = await ch.consume(
  args.queue,
  (msg) => {
    if (msg === null) return // the queue was deleted
    void pusher.post(msg.content).then(async (ok) => {
      if (ok) {
        ch.ack(msg)
        acked++
      } else {
        await sleep(100)
        ch.nack(msg, false, true)
        nacked++
      }
    })
  },
  { noAck: false },
)

serveIpc({ stats: () => ({ ...pusher.counts, acked, nacked }) }, { pid: process.pid })

process.on('SIGTERM', () => {
  void ch
    .cancel(consumerTag)
    .then(() => conn.close())
    .then(() => pusher.close())
    .finally(() => process.exit(0))
})

/**
 * The NATS JetStream push worker of bench/peers.ts: one connection consuming the bench's stream
 * through its durable pull consumer (created by bench/peers.ts with max_ack_pending `concurrency`,
 * so at most that many messages unacked, i.e. POSTs in flight). Each message's data is POSTed to
 * the sink as it is (bench/lib/push.ts); the message is acked after a 2xx, else nak'ed for
 * redelivery after 100 ms.
 *
 * Driven over IPC (bench/lib/ipc.ts): `ready` once consuming; `stats` answers the pushes made and
 * the acks sent. SIGTERM stops consuming and drains the connection.
 *
 * argv[2]: JSON { natsUrl, sinkUrl, stream, consumer, concurrency }
 */
import { jetstream } from '@nats-io/jetstream'
import { connect } from '@nats-io/transport-node'
import { serveIpc } from './lib/ipc.ts'
import { makePusher } from './lib/push.ts'

const args = JSON.parse(process.argv[2] ?? '{}') as {
  natsUrl: string
  sinkUrl: string
  stream: string
  consumer: string
  concurrency: number
}

const pusher = makePusher(args.sinkUrl, args.concurrency)
const nc = await connect({ servers: args.natsUrl })
const consumer = await jetstream(nc).consumers.get(args.stream, args.consumer)
let acked = 0
let nacked = 0
// Pull requests for up to `concurrency` messages; the consumer's max_ack_pending bounds what is unacked.
const messages = await consumer.consume({
  max_messages: args.concurrency,
  callback: (m) => {
    void pusher.post(m.data).then((ok) => {
      if (ok) {
        m.ack()
        acked++
      } else {
        m.nak(100)
        nacked++
      }
    })
  },
})

serveIpc({ stats: () => ({ ...pusher.counts, acked, nacked }) }, { pid: process.pid })

process.on('SIGTERM', () => {
  void messages
    .close()
    .then(() => nc.drain())
    .then(() => pusher.close())
    .finally(() => process.exit(0))
})

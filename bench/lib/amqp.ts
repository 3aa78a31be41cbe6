/** RabbitMQ for bench/peers.ts: the bench's quorum queue, declared before a round and deleted after it. */
import amqp, { type Channel, type ChannelModel } from 'amqplib'

/** Runs `fn` on a connection of its own, closed after it whatever happens. */
async function connected<T>(url: string, fn: (conn: ChannelModel) => Promise<T>): Promise<T> {
  const conn = await amqp.connect(url)
  try {
    return await fn(conn)
  } finally {
    await conn.close()
  }
}

const onChannel = <T>(url: string, fn: (ch: Channel) => Promise<T>) => connected(url, async (conn) => fn(await conn.createChannel()))

/** The server's version, as it announces itself on connecting. */
export const rabbitVersion = (url: string): Promise<string> =>
  connected(url, async (conn) => String(conn.connection.serverProperties.version ?? '?'))

/** Declares a durable quorum queue `name` (x-queue-type: quorum). */
export const declareQuorumQueue = (url: string, name: string): Promise<void> =>
  onChannel(url, async (ch) => {
    await ch.assertQueue(name, { durable: true, arguments: { 'x-queue-type': 'quorum' } })
  })

/** Deletes queue `name` with whatever it still holds; answers how many messages that was. */
export const deleteQueue = (url: string, name: string): Promise<number> =>
  onChannel(url, async (ch) => (await ch.deleteQueue(name)).messageCount)

/** RabbitMQ for bench/peers.ts: the bench's quorum queue, declared before a round and deleted after it. */
import amqp from 'amqplib'

/** The server's version, as it announces itself on connecting. */
export async function rabbitVersion(url: string): Promise<string> {
  const conn = await amqp.connect(url)
  try {
    return String(conn.connection.serverProperties.version ?? '?')
  } finally {
    await conn.close()
  }
}

/** Declares a durable quorum queue `name` (x-queue-type: quorum). */
export async function declareQuorumQueue(url: string, name: string): Promise<void> {
  const conn = await amqp.connect(url)
  try {
    const ch = await conn.createChannel()
    await ch.assertQueue(name, { durable: true, arguments: { 'x-queue-type': 'quorum' } })
  } finally {
    await conn.close()
  }
}

/** Deletes queue `name` with whatever it still holds; answers how many messages that was. */
export async function deleteQueue(url: string, name: string): Promise<number> {
  const conn = await amqp.connect(url)
  try {
    const ch = await conn.createChannel()
    return (await ch.deleteQueue(name)).messageCount
  } finally {
    await conn.close()
  }
}

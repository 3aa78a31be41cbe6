/**
 * NATS JetStream for bench/peers.ts: the bench's stream (file storage, work-queue retention: a
 * message is removed once acked) and its durable pull consumer (explicit acks, at most
 * `maxAckPending` unacked), created before a round and deleted after it.
 */
import { AckPolicy, jetstreamManager, RetentionPolicy, StorageType } from '@nats-io/jetstream'
import { connect } from '@nats-io/transport-node'

/** The consumer every bench stream gets. */
export const NATS_CONSUMER = 'push'

/** The server's version, as it announces itself on connecting. */
export async function natsVersion(url: string): Promise<string> {
  const nc = await connect({ servers: url })
  try {
    return nc.info?.version ?? '?'
  } finally {
    await nc.close()
  }
}

/** Creates stream `name` on subject `name` and its consumer NATS_CONSUMER. */
export async function createStream(url: string, name: string, maxAckPending: number): Promise<void> {
  const nc = await connect({ servers: url })
  try {
    const jsm = await jetstreamManager(nc)
    await jsm.streams.add({ name, subjects: [name], storage: StorageType.File, retention: RetentionPolicy.Workqueue })
    await jsm.consumers.add(name, { durable_name: NATS_CONSUMER, ack_policy: AckPolicy.Explicit, max_ack_pending: maxAckPending })
  } finally {
    await nc.close()
  }
}

/** Deletes stream `name` (its consumer and whatever it still holds); answers how many messages that was. */
export async function deleteStream(url: string, name: string): Promise<number> {
  const nc = await connect({ servers: url })
  try {
    const jsm = await jetstreamManager(nc)
    const left = (await jsm.streams.info(name)).state.messages
    await jsm.streams.delete(name)
    return left
  } finally {
    await nc.close()
  }
}

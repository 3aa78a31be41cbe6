/**
 * Choosing a partition. A keyed message goes where Kafka's default partitioner would put it
 * (murmur2 of the key's UTF-8 bytes, sign bit cleared, modulo the partition count), so a key's
 * messages stay on one partition and mirror a Kafka topic with the same partition count.
 *
 * Produce (src/service/produce.ts) and the dispatcher's dead letters (src/dispatch/partition-state.ts)
 * both place messages by it, so it sits below both and imports nothing of either.
 */

/** Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit integer. */
export function murmur2(data: Uint8Array): number {
  const m = 0x5bd1e995
  const length = data.length
  let h = 0x9747b28c ^ length
  const tail = length & ~3
  for (let i = 0; i < tail; i += 4) {
    let k = data[i]! | (data[i + 1]! << 8) | (data[i + 2]! << 16) | (data[i + 3]! << 24)
    k = Math.imul(k, m)
    k ^= k >>> 24
    k = Math.imul(k, m)
    h = Math.imul(h, m) ^ k
  }
  const rest = length & 3
  if (rest > 0) {
    if (rest === 3) h ^= data[tail + 2]! << 16
    if (rest >= 2) h ^= data[tail + 1]! << 8
    h ^= data[tail]!
    h = Math.imul(h, m)
  }
  h ^= h >>> 13
  h = Math.imul(h, m)
  h ^= h >>> 15
  return h | 0
}

/** The partition of a keyed message. */
export function partitionForKey(key: string, partitions: number): number {
  return (murmur2(Buffer.from(key, 'utf8')) & 0x7fffffff) % partitions
}

/** Spreads unkeyed messages evenly: round robin per topic. */
export class RoundRobin {
  private readonly next = new Map<number, number>()

  /** The next partition for the topic. */
  pick(topicId: number, partitions: number): number {
    const n = this.next.get(topicId) ?? Math.floor(Math.random() * partitions)
    this.next.set(topicId, (n + 1) % partitions)
    return n % partitions
  }

  forget(topicId: number): void {
    this.next.delete(topicId)
  }
}

/**
 * Delivery ids: what a consumer acks with, and the key of the attempt row it names.
 *
 * An id carries the attempt's coordinates (group, partition, offset, attempt) beside 128 random
 * bits, as base64url of 36 bytes (48 characters). The coordinates let any broker process find the
 * row by its primary key — and the partition, hence its owner — without an index over random text
 * (which cost the attempt log a random B-tree insert per push). The random part keeps the id
 * unguessable: a lookup matches the whole id, so knowing the coordinates gets nobody anywhere.
 */
import { randomFillSync } from 'node:crypto'

/** Where an attempt is: the attempt row's primary key. */
export interface AttemptKey {
  groupId: number
  partition: number
  offset: number
  attempt: number
}

const BYTES = 36 // group u32, partition u32, offset u64, attempt u32, 16 random bytes
const LENGTH = 48 // base64url of 36 bytes, no padding

// Random bytes are taken from a pool filled 1,024 ids at a time: one call into the CSPRNG per
// thousand pushes instead of one per push.
const pool = Buffer.allocUnsafe(16 * 1024)
let poolUsed = pool.length

/** The bytes of the id being made: one buffer for all of them (the id is a string once made). */
const scratch = Buffer.alloc(BYTES)

/** A new delivery id for the attempt at `key`. */
export function newDeliveryId(key: AttemptKey): string {
  const b = scratch
  b.writeUInt32BE(key.groupId, 0)
  b.writeUInt32BE(key.partition, 4)
  // As two 32-bit halves: offsets are safe integers, and a BigInt per push is an allocation for nothing.
  b.writeUInt32BE(Math.floor(key.offset / 2 ** 32), 8)
  b.writeUInt32BE(key.offset >>> 0, 12)
  b.writeUInt32BE(key.attempt, 16)
  if (poolUsed === pool.length) {
    randomFillSync(pool)
    poolUsed = 0
  }
  pool.copy(b, 20, poolUsed, poolUsed + 16)
  poolUsed += 16
  return b.toString('base64url', 0, BYTES)
}

/** The coordinates a delivery id carries, or null for anything that is not one of ours. */
export function parseDeliveryId(id: string): AttemptKey | null {
  if (id.length !== LENGTH || !/^[A-Za-z0-9_-]+$/.test(id)) return null
  const b = Buffer.from(id, 'base64url')
  if (b.length !== BYTES) return null
  const offset = b.readBigUInt64BE(8)
  if (offset > BigInt(Number.MAX_SAFE_INTEGER)) return null
  return { groupId: b.readUInt32BE(0), partition: b.readUInt32BE(4), offset: Number(offset), attempt: b.readUInt32BE(16) }
}

/**
 * Which consumer of a group gets which partition: partition p goes to the (p mod n)-th of the n
 * enabled consumers, in the order they are listed. The dispatcher pushes by it and the group's
 * status shows it (src/service/groups.ts): it lives here, with the dispatcher, because the
 * services may import the dispatcher but not the other way round (.dependency-cruiser.cjs).
 */

/** The partition → consumer assignment (null when the group has no enabled consumer). */
export function assignPartitions(partitions: number, consumers: { id: string; disabledAt: Date | null }[]): (string | null)[] {
  const enabled = consumers.filter((c) => c.disabledAt === null)
  return Array.from({ length: partitions }, (_, p) => (enabled.length === 0 ? null : enabled[p % enabled.length]!.id))
}

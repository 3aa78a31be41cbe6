/**
 * Which consumer of a group gets which partition: partition p goes to the (p mod n)-th of the n
 * enabled consumers, in the order they are listed. The dispatcher pushes by it and the group's
 * status shows it (src/service/groups.ts). Not to be confused with the ownership plan
 * (src/cluster/ownership-plan.ts), which says which broker process holds which partition.
 */

/** The partition → consumer assignment (null when the group has no enabled consumer). */
export function assignPartitions(partitions: number, consumers: { id: string; disabledAt: Date | null }[]): (string | null)[] {
  const enabled = consumers.filter((c) => c.disabledAt === null)
  return Array.from({ length: partitions }, (_, p) => (enabled.length === 0 ? null : enabled[p % enabled.length]!.id))
}

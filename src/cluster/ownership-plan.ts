/**
 * Which live member should own which (group, partition): a pure function of what every member
 * reads in one query (src/store/membership.ts view()), so all of them compute the same answer
 * without talking to each other.
 *
 * - Each group is spread evenly on its own: a member gets ⌊P/n⌋ of a group's P partitions, and the
 *   P mod n members next in turn after the group's id get one more, so the extra partitions of
 *   many small groups do not all land on the same member.
 * - Sticky: a partition stays with its holder while the holder is under its share, and only
 *   partitions that must move do (a member joining takes its share from the others, a dead one's
 *   share goes to the rest); the others keep pushing undisturbed (the cooperative rebalancing of
 *   Kafka's KIP-429, without the protocol: the locks say who holds what).
 */
import type { ClusterView } from '../store/membership.ts'

/** "groupId:partition" → the pid of the member that should own it. */
export type OwnershipPlan = Map<string, number>

export const pairKey = (groupId: number, partition: number): string => `${groupId}:${partition}`

export function planOwnership(view: Pick<ClusterView, 'members' | 'holders' | 'groups'>): OwnershipPlan {
  const out: OwnershipPlan = new Map()
  const members = [...new Set(view.members.map((m) => m.pid))].sort((a, b) => a - b)
  const n = members.length
  if (n === 0) return out
  const holderOf = new Map(view.holders.map((h) => [pairKey(h.groupId, h.partition), h.pid]))
  for (const g of [...view.groups].sort((a, b) => a.groupId - b.groupId)) {
    const base = Math.floor(g.partitions / n)
    const extra = g.partitions % n
    const share = new Map(members.map((pid, i) => [pid, base + ((((i - g.groupId) % n) + n) % n < extra ? 1 : 0)]))
    const count = new Map(members.map((pid) => [pid, 0]))
    const unplaced: number[] = []
    for (let p = 0; p < g.partitions; p++) {
      const holder = holderOf.get(pairKey(g.groupId, p))
      if (holder !== undefined && count.has(holder) && count.get(holder)! < share.get(holder)!) {
        out.set(pairKey(g.groupId, p), holder)
        count.set(holder, count.get(holder)! + 1)
      } else {
        unplaced.push(p)
      }
    }
    let i = 0
    for (const p of unplaced) {
      while (count.get(members[i]!)! >= share.get(members[i]!)!) i++
      out.set(pairKey(g.groupId, p), members[i]!)
      count.set(members[i]!, count.get(members[i]!)! + 1)
    }
  }
  return out
}

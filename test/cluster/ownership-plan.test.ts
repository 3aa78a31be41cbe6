/** The ownership plan: which broker process should hold which partition: even per group, the same for every member, and sticky. */
import t from '../helpers/tap.ts'
import { pairKey, planOwnership } from '../../src/cluster/ownership-plan.ts'
import type { ClusterView } from '../../src/store/membership.ts'

type View = Pick<ClusterView, 'members' | 'holders' | 'groups'>
const members = (...pids: number[]) => pids.map((pid) => ({ pid, url: `http://127.0.0.1:${pid}` }))
const counts = (a: Map<string, number>, groupId?: number) => {
  const c = new Map<number, number>()
  for (const [k, pid] of a) if (groupId === undefined || k.startsWith(`${groupId}:`)) c.set(pid, (c.get(pid) ?? 0) + 1)
  return [...c.values()].sort((x, y) => x - y)
}

t.test('every partition gets exactly one member, each group spread evenly', async (t) => {
  const view: View = {
    members: members(30, 10, 20),
    holders: [],
    groups: [
      { groupId: 1, name: 'a', partitions: 8 },
      { groupId: 2, name: 'b', partitions: 3 },
    ],
  }
  const a = planOwnership(view)
  t.equal(a.size, 11, 'every partition of every group')
  t.same(counts(a, 1), [2, 3, 3], '8 partitions over 3 members')
  t.same(counts(a, 2), [1, 1, 1], '3 partitions over 3 members')
  t.same(planOwnership({ ...view, members: [...view.members].reverse() }), a, 'the order the members were read in does not matter')
})

t.test('the extra partitions of small groups do not all go to one member', async (t) => {
  const groups = Array.from({ length: 6 }, (_, i) => ({ groupId: i + 1, name: `g${i}`, partitions: 1 }))
  t.same(counts(planOwnership({ members: members(1, 2, 3), holders: [], groups })), [2, 2, 2])
})

t.test('sticky: a member that joins takes only its share; a member that leaves gives only its own', async (t) => {
  const groups = [{ groupId: 7, name: 'g', partitions: 12 }]
  const before = planOwnership({ members: members(1, 2), holders: [], groups })
  const holders = [...before].map(([k, pid]) => ({ groupId: 7, partition: Number(k.split(':')[1]), pid }))
  const joined = planOwnership({ members: members(1, 2, 3), holders, groups })
  const moved = [...joined].filter(([k, pid]) => before.get(k) !== pid)
  t.equal(moved.length, 4, 'a third of the partitions move, all of them to the newcomer')
  t.ok(moved.every(([, pid]) => pid === 3))
  const held3 = [...joined].map(([k, pid]) => ({ groupId: 7, partition: Number(k.split(':')[1]), pid }))
  const left = planOwnership({ members: members(1, 3), holders: held3.filter((h) => h.pid !== 2), groups })
  t.ok(
    [...left].every(([k, pid]) => joined.get(k) === 2 || pid === joined.get(k)),
    "only the leaver's partitions move",
  )
  t.same(counts(left), [6, 6])
})

t.test('a holder that is not a live member keeps nothing', async (t) => {
  const a = planOwnership({
    members: members(1),
    holders: [{ groupId: 1, partition: 0, pid: 99 }],
    groups: [{ groupId: 1, name: 'g', partitions: 2 }],
  })
  t.equal(a.get(pairKey(1, 0)), 1)
  t.equal(a.get(pairKey(1, 1)), 1)
  t.same(
    planOwnership({ members: [], holders: [], groups: [{ groupId: 1, name: 'g', partitions: 2 }] }).size,
    0,
    'no members, no assignment',
  )
})

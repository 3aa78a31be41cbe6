/** How a gathered pull splits maxMessages between the owners of a group's partitions (src/service/acks.ts shares). */
import t from '../helpers/tap.ts'
import { shares } from '../../src/service/acks.ts'

const sum = (xs: number[]) => xs.reduce((n, x) => n + x, 0)

t.test('by partitions owned, never more than maxMessages in all', async (t) => {
  t.same(shares([{ parts: 2 }, { parts: 2 }], 100, 0), [50, 50])
  t.same(shares([{ parts: 3 }, { parts: 1 }], 100, 0), [75, 25])
  t.same(shares([{ parts: 1 }, { parts: 1 }, { parts: 1 }], 100, 0), [34, 33, 33])
  t.same(shares([{ parts: 1 }, { parts: 1 }, { parts: 1 }], 100, 1), [33, 34, 33], 'the rounding goes in turn')
})

t.test('an owner whose share rounds to 0 gets one in its turn', async (t) => {
  const sources = [{ parts: 2 }, { parts: 2 }, { parts: 2 }]
  const asked = new Set<number>()
  for (let turn = 0; turn < 3; turn++) {
    const s = shares(sources, 1, turn)
    t.equal(sum(s), 1)
    asked.add(s.indexOf(1))
  }
  t.same([...asked].sort(), [0, 1, 2], 'each owner asked once in three pulls of one message')
})

t.test('owners that said a message could go get one first, within maxMessages', async (t) => {
  t.same(shares([{ parts: 2 }, { parts: 2 }], 1, 0, [1]), [0, 1])
  t.same(shares([{ parts: 30 }, { parts: 1 }], 10, 0, [1]), [9, 1], 'taken from the largest share')
  const s = shares([{ parts: 1 }, { parts: 1 }, { parts: 1 }], 2, 0, [0, 2])
  t.same(s, [1, 0, 1])
  for (let max = 1; max <= 7; max++)
    for (let turn = 0; turn < 4; turn++)
      t.ok(sum(shares([{ parts: 5 }, { parts: 1 }, { parts: 2 }, { parts: 1 }], max, turn, [3])) <= max, `max ${max} turn ${turn}`)
})

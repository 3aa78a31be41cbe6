/** The list helper of the partition's ready queue (the attempts' lists: test/dispatch/partition.test.ts). */
import t from '../helpers/tap.ts'
import { removeAt } from '../../src/dispatch/partition-state.ts'

t.test('removeAt keeps the order of the rest; a negative index removes nothing', async (t) => {
  const list = ['a', 'b', 'c', 'd']
  removeAt(list, 1)
  t.same(list, ['a', 'c', 'd'])
  removeAt(list, 2)
  t.same(list, ['a', 'c'])
  removeAt(list, -1)
  t.same(list, ['a', 'c'])
  removeAt(list, 0)
  removeAt(list, 0)
  t.same(list, [])
})

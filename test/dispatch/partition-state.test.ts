/** The small list helpers of an outstanding message: its delivery ids and the partition's ready queue. */
import t from 'tap'
import { NO_TRACE } from '../helpers/messages.ts'
import { addId, closeAttempt, EMPTY, newOutstanding, removeAt } from '../../src/dispatch/partition-state.ts'

const msg = { offset: 0, key: null, value: '1', headers: '{}', producedAtMs: 0, availableAtMs: 0, ...NO_TRACE }
const outstanding = () => newOutstanding(msg, 0, false)

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

t.test('ids and open attempts: each message gets lists of its own, the shared empty one stays empty', async (t) => {
  const a = outstanding()
  const b = outstanding()
  t.equal(a.ids, EMPTY, 'a new message shares the empty list until its first id')
  addId(a, 'a1')
  t.same(a.ids, ['a1'])
  t.same(a.open, ['a1'])
  t.same(b.ids, [], 'another message is untouched')
  t.same(EMPTY, [])
  closeAttempt(a, 'a1')
  t.same(a.open, [])
  t.same(a.ids, ['a1'], 'an id issued stays issued: a late ack of it still counts')
  addId(a, 'a2')
  addId(a, 'a3')
  t.same(a.ids, ['a1', 'a2', 'a3'])
  t.same(a.open, ['a2', 'a3'])
  closeAttempt(a, 'a2')
  closeAttempt(a, 'unknown')
  t.same(a.open, ['a3'])
  t.throws(() => EMPTY.push('x'), 'the shared empty list cannot be written to')
})

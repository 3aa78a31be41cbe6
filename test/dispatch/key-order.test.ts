/** The key-ordering structure: one message per key out, the rest waiting in offset order. */
import t from '../helpers/tap.ts'
import { KeyOrder } from '../../src/dispatch/key-order.ts'
import type { DispatchMessage } from '../../src/core/dispatch-message.ts'

const msg = (offset: number, key: string | null): DispatchMessage => ({
  offset,
  key,
  value: '1',
  headers: '{}',
  producedAtMs: 0,
  availableAtMs: 0,
  traceId: '0af7651916cd43dd8448eb211c80319c',
  traceparent: null,
  tracestate: null,
})

t.test('one message per key; the next on release, in offset order; unkeyed ones always go', async (t) => {
  const k = new KeyOrder()
  t.ok(k.take(msg(0, 'a')))
  t.ok(k.take(msg(1, 'b')))
  t.notOk(k.take(msg(2, 'a')))
  t.ok(k.take(msg(3, null)))
  t.notOk(k.take(msg(4, 'a')))
  t.equal(k.queued, 2)
  t.equal(k.release('a')?.offset, 2, 'a: the next in offset order, which now holds the key')
  t.ok(k.isBusy('a'))
  t.notOk(k.take(msg(5, 'a')))
  t.equal(k.release('a')?.offset, 4)
  t.equal(k.release('a')?.offset, 5)
  t.equal(k.release('a'), undefined, 'none left: the key is free')
  t.notOk(k.isBusy('a'))
  t.equal(k.queued, 0)
  t.equal(k.release('b'), undefined)
  t.ok(k.take(msg(6, 'b')), 'b is free again')
})

t.test('messages already out when the group switched hold their key until all complete', async (t) => {
  const k = new KeyOrder()
  k.hold('a')
  k.hold('a')
  t.notOk(k.take(msg(7, 'a')))
  t.equal(k.release('a'), undefined, 'one of the two still out')
  t.equal(k.release('a')?.offset, 7)
})

t.test('drain hands every waiting message back in offset order', async (t) => {
  const k = new KeyOrder()
  for (const [o, key] of [
    [0, 'a'],
    [1, 'b'],
    [2, 'b'],
    [3, 'a'],
    [4, 'b'],
  ] as const)
    k.take(msg(o, key))
  t.same(
    k.drain().map((m) => m.offset),
    [2, 3, 4],
  )
  t.equal(k.queued, 0)
  t.ok(k.take(msg(5, 'a')), 'and forgets the keys')
})

import t from '../helpers/tap.ts'
import { MinHeap, type HeapEntry } from '../../src/dispatch/min-heap.ts'
import { mulberry32 } from '../helpers/prng.ts'

class Item implements HeapEntry {
  index = -1
  constructor(
    public deadlineMs: number,
    public readonly name = String(deadlineMs),
  ) {}
}

function drain(heap: MinHeap<Item>): number[] {
  const out: number[] = []
  for (let item = heap.pop(); item !== undefined; item = heap.pop()) out.push(item.deadlineMs)
  return out
}

function filled(keys: number[]): { heap: MinHeap<Item>; items: Item[] } {
  const heap = new MinHeap<Item>()
  const items = keys.map((k) => new Item(k))
  for (const item of items) heap.push(item)
  heap.checkInvariant()
  return { heap, items }
}

t.test('empty heap', async (t) => {
  const heap = new MinHeap<Item>()
  t.equal(heap.size, 0)
  t.equal(heap.peek(), undefined)
  t.equal(heap.pop(), undefined)
  const stranger = new Item(5)
  t.equal(heap.remove(stranger), false)
  t.throws(() => heap.update(stranger, 1), /not in this heap/)
  t.equal(heap.contains(stranger), false)
  heap.checkInvariant()
})

t.test('single element: push, peek, pop, remove', async (t) => {
  const heap = new MinHeap<Item>()
  const a = new Item(7)
  heap.push(a)
  t.equal(a.index, 0)
  t.equal(heap.size, 1)
  t.equal(heap.peek(), a)
  t.equal(heap.size, 1, 'peek leaves it in place')
  t.equal(heap.pop(), a)
  t.equal(a.index, -1)
  t.equal(heap.size, 0)
  heap.push(a)
  t.equal(heap.remove(a), true)
  t.equal(a.index, -1)
  t.equal(heap.size, 0)
  t.equal(heap.remove(a), false, 'a second remove is a no-op')
})

t.test('pops in key order, duplicates included', async (t) => {
  const keys = [5, 3, 9, 3, 1, 8, 5, 5, 0, 12, 3, -4, 1.5]
  const { heap } = filled(keys)
  t.equal(heap.peek()!.deadlineMs, -4)
  t.same(
    drain(heap),
    [...keys].sort((a, b) => a - b),
  )
})

t.test('push throws for an entry already in a heap', async (t) => {
  const { heap, items } = filled([1, 2])
  t.throws(() => heap.push(items[0]!), /already in a heap/)
  const other = new MinHeap<Item>()
  t.throws(() => other.push(items[1]!), /already in a heap/)
  t.equal(other.size, 0)
  t.equal(other.remove(items[1]!), false, 'not in this heap, even with a valid-looking index')
  t.throws(() => other.update(items[1]!, 0), /not in this heap/)
  heap.checkInvariant()
})

t.test('remove the root, the last and a middle entry', async (t) => {
  const keys = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  {
    const { heap, items } = filled(keys)
    t.equal(heap.remove(items[0]!), true, 'root')
    heap.checkInvariant()
    t.same(drain(heap), [2, 3, 4, 5, 6, 7, 8, 9, 10])
  }
  {
    const { heap, items } = filled(keys)
    const last = items.find((item) => item.index === heap.size - 1)!
    t.equal(heap.remove(last), true, 'last')
    heap.checkInvariant()
    t.same(
      drain(heap),
      keys.filter((k) => k !== last.deadlineMs),
    )
  }
  {
    const { heap, items } = filled(keys)
    const middle = items.find((item) => item.index === 4)!
    t.equal(heap.remove(middle), true, 'middle')
    t.equal(middle.index, -1)
    heap.checkInvariant()
    t.same(
      drain(heap),
      keys.filter((k) => k !== middle.deadlineMs),
    )
  }
})

t.test('removing a middle entry whose replacement must move up', async (t) => {
  // A valid heap in array order: the left subtree holds large keys, the last entry (5) sits under the right one.
  const { heap, items } = filled([0, 50, 1, 60, 70, 2, 3, 61, 62, 71, 72, 4, 5])
  const sixty = items[3]!
  const five = items[12]!
  t.equal(sixty.index, 3)
  t.equal(heap.remove(sixty), true)
  heap.checkInvariant()
  t.equal(five.index, 1, 'the replacement climbed above 50')
  t.same(drain(heap), [0, 1, 2, 3, 4, 5, 50, 61, 62, 70, 71, 72])
})

t.test('update moves an entry up and down', async (t) => {
  const { heap, items } = filled([10, 20, 30, 40, 50, 60, 70])
  const seventy = items[6]!
  heap.update(seventy, 5)
  heap.checkInvariant()
  t.equal(heap.peek(), seventy, 'up to the root')
  heap.update(seventy, 45)
  heap.checkInvariant()
  t.equal(heap.peek()!.deadlineMs, 10)
  const root = heap.peek()!
  heap.update(root, 1000)
  heap.checkInvariant()
  t.equal(heap.peek()!.deadlineMs, 20, 'root down to a leaf')
  heap.update(root, 1000)
  heap.checkInvariant()
  t.same(drain(heap), [20, 30, 40, 45, 50, 60, 1000])
})

t.test('clear marks every entry as out of the heap', async (t) => {
  const { heap, items } = filled([3, 1, 2])
  heap.clear()
  t.equal(heap.size, 0)
  t.ok(items.every((item) => item.index === -1))
  heap.push(items[0]!)
  t.equal(heap.peek(), items[0])
})

t.test('checkInvariant reports a bypassed update, a broken order and a wrong index', async (t) => {
  const { heap, items } = filled([1, 2, 3])
  items[0]!.deadlineMs = 99 // assigning instead of calling update
  t.throws(() => heap.checkInvariant(), /heap key at 0 is 1, entry says 99/)
  ;(heap as unknown as { keys: Float64Array }).keys[0] = 99 // and the mirrored key too
  t.throws(() => heap.checkInvariant(), /heap order broken/)
  const again = filled([1, 2, 3])
  again.items[2]!.index = 0
  t.throws(() => again.heap.checkInvariant(), /says index/)
})

t.test('the key array grows and shrinks with the heap', async (t) => {
  const heap = new MinHeap<Item>()
  const items = Array.from({ length: 5000 }, (_, i) => new Item((i * 7919) % 5003))
  for (const item of items) heap.push(item)
  heap.checkInvariant()
  for (const item of items.slice(0, 4990)) heap.remove(item)
  heap.checkInvariant()
  t.same(
    drain(heap),
    items
      .slice(4990)
      .map((i) => i.deadlineMs)
      .sort((a, b) => a - b),
  )
  heap.push(items[0]!)
  heap.checkInvariant()
  t.equal(heap.size, 1)
})

t.test('random operations against a sorted array', async (t) => {
  const seed = Number(process.env.SEED ?? Math.floor(Math.random() * 2 ** 32))
  const random = mulberry32(seed)
  const heap = new MinHeap<Item>()
  let model: Item[] = []
  const steps = 20_000
  let failure: string | undefined
  for (let step = 0; step < steps && failure === undefined; step++) {
    const op = random()
    const key = Math.floor(random() * 200) // a small key range makes duplicates common
    try {
      if (op < 0.4 || model.length === 0) {
        const item = new Item(key)
        heap.push(item)
        model.push(item)
      } else if (op < 0.55) {
        const item = heap.pop()!
        const min = Math.min(...model.map((m) => m.deadlineMs))
        if (item.deadlineMs !== min) failure = `pop gave ${item.deadlineMs}, min is ${min}`
        model = model.filter((m) => m !== item)
      } else if (op < 0.75) {
        const item = model[Math.floor(random() * model.length)]!
        if (!heap.remove(item)) failure = 'remove of a present entry returned false'
        model = model.filter((m) => m !== item)
      } else {
        heap.update(model[Math.floor(random() * model.length)]!, key)
      }
      heap.checkInvariant()
      if (heap.size !== model.length) failure = `size ${heap.size}, model ${model.length}`
      const min = model.length === 0 ? undefined : Math.min(...model.map((m) => m.deadlineMs))
      if (heap.peek()?.deadlineMs !== min) failure = `peek ${heap.peek()?.deadlineMs}, model min ${min}`
    } catch (err) {
      failure = String(err)
    }
    if (failure !== undefined) failure = `SEED=${seed} step ${step}: ${failure}`
  }
  if (failure !== undefined) t.fail(failure)
  else t.pass(`${steps} random operations match the model (SEED=${seed})`)
  t.same(
    drain(heap),
    model.map((m) => m.deadlineMs).sort((a, b) => a - b),
    `final drain (SEED=${seed})`,
  )
})

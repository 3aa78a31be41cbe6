/**
 * The wait queue (src/dispatch/waits.ts) alone: waits end in deadline order, a cancelled one never
 * comes back, and random adds, cancels and takes agree with a plain sorted list.
 */
import t from '../helpers/tap.ts'
import { Wait, WaitQueue } from '../../src/dispatch/waits.ts'
import { mulberry32 } from '../helpers/prng.ts'

t.test('due waits come out earliest first, typed, at most `limit` at a time', async (t) => {
  const q = new WaitQueue()
  q.add(new Wait('retry', 1, 0, 7, 300))
  q.add(new Wait('delay', 1, 0, 5, 100))
  const dl = q.add(new Wait('dead_letter_retry', 2, 3, 9, 200))
  t.equal(q.nextDeadlineMs(), 100)
  t.same(q.takeDue(99), [], 'nothing before its time')
  t.same(
    q.takeDue(250, 1).map((w) => [w.kind, w.offset]),
    [['delay', 5]],
    'the limit holds',
  )
  t.same(
    q.takeDue(250).map((w) => [w.kind, w.groupId, w.partition, w.offset]),
    [['dead_letter_retry', 2, 3, 9]],
  )
  t.equal(dl.index, -1, 'a wait taken is in no queue')
  t.equal(q.cancel(dl), false, 'and cannot be cancelled')
  t.equal(q.size, 1)
})

t.test('random adds, cancels and takes agree with a sorted list', async (t) => {
  const random = mulberry32(20261203)
  const q = new WaitQueue()
  let model: Wait[] = []
  let nowMs = 0
  for (let step = 0; step < 20_000; step++) {
    const r = random()
    if (r < 0.5) {
      const w = q.add(new Wait('retry', 1, 0, step, nowMs + Math.floor(random() * 1000)))
      model.push(w)
    } else if (r < 0.7 && model.length > 0) {
      const w = model[Math.floor(random() * model.length)]!
      t.equal(q.cancel(w), true)
      model = model.filter((x) => x !== w)
    } else {
      nowMs += Math.floor(random() * 50)
      const due = q.takeDue(nowMs)
      const expected = model.filter((w) => w.deadlineMs <= nowMs).sort((a, b) => a.deadlineMs - b.deadlineMs)
      if (
        due.map((w) => w.deadlineMs).join() !== expected.map((w) => w.deadlineMs).join() ||
        new Set(due).size !== expected.length ||
        !expected.every((w) => due.includes(w))
      ) {
        t.fail(`step ${step}: due ${due.map((w) => w.deadlineMs)} expected ${expected.map((w) => w.deadlineMs)}`)
        return
      }
      model = model.filter((w) => w.deadlineMs > nowMs)
    }
    if (q.size !== model.length) {
      t.fail(`step ${step}: size ${q.size}, model ${model.length}`)
      return
    }
  }
  t.pass('20,000 random steps agreed')
})

/** The pull desk alone: takers in line, answered once handed a lease, on their timer, or when gone. */
import t from '../helpers/tap.ts'
import { setImmediate as turn } from 'node:timers/promises'
import { PullDesk, Taker } from '../../src/dispatch/pull-desk.ts'

/** Timers the test fires by hand. */
function fakeTimers() {
  const due: (() => void)[] = []
  return {
    timers: { setTimeout: (fn: () => void) => due.push(fn), clearTimeout: () => {} },
    fireAll: () => {
      for (const fn of due.splice(0)) fn()
    },
  }
}

t.test('the first taker with room gets each lease; it answers on the next turn with all it got', async (t) => {
  const { timers } = fakeTimers()
  const desk = new PullDesk({ timers, busy: () => false })
  const answers: string[][] = []
  const a = new Taker(1, 2, 1000, false, (e) => answers.push(['a', ...e]))
  const b = new Taker(1, 5, 1000, false, (e) => answers.push(['b', ...e]))
  desk.add(a, 20_000)
  desk.add(b, 20_000)
  t.equal(desk.waiters(1), 2)
  for (const env of ['1', '2', '3']) {
    const taker = desk.taker(1)!
    desk.take(taker)
    desk.hand(taker, env)
  }
  t.same(answers, [], 'nothing answered within the pass')
  await turn()
  t.same(answers, [
    ['a', '1', '2'],
    ['b', '3'],
  ])
  t.equal(desk.waiters(1), 0)
  t.equal(desk.taker(1), undefined)
})

t.test('waitMs passing answers empty; a taker gone gets nothing more; a pending lease holds the answer', async (t) => {
  const { timers, fireAll } = fakeTimers()
  const desk = new PullDesk({ timers, busy: () => false })
  const got: string[][] = []
  const a = new Taker(1, 10, 1000, false, (e) => got.push(e))
  desk.add(a, 20_000)
  fireAll()
  t.same(got, [[]], 'empty when waitMs passes')

  const b = new Taker(1, 10, 1000, false, (e) => got.push(e))
  desk.add(b, 20_000)
  desk.take(b) // a retry's lease being written
  desk.gone(b)
  t.same(got[1], [], 'answered (to nobody) when gone')
  t.equal(desk.hand(b, 'late'), false, 'the late lease goes to nobody: it expires')

  const c = new Taker(1, 10, 1000, false, (e) => got.push(e))
  desk.add(c, 20_000)
  desk.take(c)
  desk.take(c)
  desk.hand(c, 'x')
  await turn()
  t.equal(got.length, 2, 'not answered while a lease is still being written')
  desk.unhand(c)
  await turn()
  t.same(got[2], ['x'])
})

t.test('without waitMs: answers once nothing is under way', async (t) => {
  const { timers } = fakeTimers()
  let busy = true
  const desk = new PullDesk({ timers, busy: () => busy })
  const got: string[][] = []
  desk.add(new Taker(7, 10, 1000, true, (e) => got.push(e)), 0)
  desk.settled(7)
  await turn()
  t.same(got, [], 'a read is under way')
  busy = false
  desk.settled(7)
  await turn()
  t.same(got, [[]])
})

t.test(
  'a probe takes nothing: told `ready` when a message could be leased and no taker has room; closeGroup answers everyone',
  async (t) => {
    const { timers } = fakeTimers()
    const desk = new PullDesk({ timers, busy: () => false })
    const answers: string[] = []
    const probe: Taker = new Taker(1, 0, 1000, false, () => answers.push(`probe ready=${probe.ready}`), true)
    desk.add(probe, 20_000)
    t.ok(desk.wanted(1), 'a probe waiting: the group reads ahead')
    t.equal(desk.taker(1), undefined, 'a probe has no room: nothing is leased to it')
    desk.leasable(1)
    t.same(answers, ['probe ready=true'])
    t.notOk(desk.wanted(1))

    const other: Taker = new Taker(2, 0, 1000, false, () => answers.push(`other ready=${other.ready}`), true)
    const taker = new Taker(2, 5, 1000, false, (e) => answers.push(`taker ${e.length}`))
    desk.add(other, 20_000)
    desk.add(taker, 20_000)
    desk.closeGroup(2)
    t.same(answers.slice(1), ['other ready=false', 'taker 0'], 'the group gone: every caller answered at once')
    t.equal(desk.waiters(2), 0)
  },
)

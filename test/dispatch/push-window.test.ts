/** The push window alone: slow-start growth, halving on congestion, bounds, and what counts as congestion. */
import t from '../helpers/tap.ts'
import { PushWindow, pushSignal } from '../../src/dispatch/push-window.ts'

/**
 * Runs `n` round trips of a pipeline that keeps the window full, as the dispatcher does with a
 * backlog: each push that ends is replaced at once while there is room. The limit after each round.
 */
function rounds(w: PushWindow, n: number, signal: 'ok' | 'congested'): number[] {
  const limits: number[] = []
  while (w.hasRoom()) w.acquire()
  for (let r = 0; r < n; r++) {
    const k = w.inFlight
    for (let i = 0; i < k; i++) {
      w.release(signal)
      while (w.hasRoom()) w.acquire()
    }
    limits.push(w.limit)
  }
  return limits
}

t.test('starts at initial and doubles every fully used round trip, up to max', async (t) => {
  const w = new PushWindow({ initial: 4, max: 100 })
  t.equal(w.limit, 4)
  t.same(rounds(w, 6, 'ok'), [8, 16, 32, 64, 100, 100])
})

t.test('each congestion signal halves it, never below min', async (t) => {
  const w = new PushWindow({ initial: 64, min: 2 })
  for (let i = 0; i < 3; i++) w.acquire()
  w.release('congested')
  t.equal(w.limit, 32)
  w.release('congested')
  w.release('congested')
  t.equal(w.limit, 8)
  w.shrink()
  w.shrink()
  w.shrink()
  t.equal(w.limit, 2, 'min holds')
  t.equal(w.inFlight, 0)
})

t.test('recovers from 1 by slow start after the consumer heals', async (t) => {
  const w = new PushWindow({ initial: 32, max: 64 })
  rounds(w, 1, 'congested')
  t.equal(w.limit, 1)
  t.same(rounds(w, 7, 'ok'), [2, 4, 8, 16, 32, 64, 64])
})

t.test('a window that is not the limit does not grow', async (t) => {
  const w = new PushWindow({ initial: 8 })
  for (let i = 0; i < 100; i++) {
    w.acquire()
    w.release('ok')
  } // one push at a time, 100 times
  t.equal(w.limit, 8)
  for (let i = 0; i < 4; i++) w.acquire()
  w.release('ok') // 4 of 8 in use: half, counts as used
  t.equal(w.limit, 9)
})

t.test('hasRoom follows inFlight against the limit; neutral answers change nothing', async (t) => {
  const w = new PushWindow({ initial: 2 })
  t.ok(w.hasRoom())
  w.acquire()
  w.acquire()
  t.notOk(w.hasRoom())
  w.release('neutral')
  t.ok(w.hasRoom())
  t.equal(w.limit, 2)
  w.release('neutral')
  w.release('neutral') // an extra release never makes inFlight negative
  t.equal(w.inFlight, 0)
})

t.test('bad bounds are clamped: min at least 1, max at least min, initial between', async (t) => {
  t.equal(new PushWindow({ initial: 0 }).limit, 1)
  t.equal(new PushWindow({ initial: 50, max: 10 }).limit, 10)
  t.equal(new PushWindow({ initial: 1, min: 4, max: 2 }).limit, 4)
})

t.test('congestion: 429, 502-504, timeouts and network errors; not other answers', async (t) => {
  t.equal(pushSignal({ kind: 'delivered', status: 200 }), 'ok')
  t.equal(pushSignal({ kind: 'rejected', status: 429 }), 'congested')
  for (const status of [502, 503, 504]) t.equal(pushSignal({ kind: 'rejected', status }), 'congested', String(status))
  t.equal(pushSignal({ kind: 'rejected', status: 500 }), 'neutral', 'a 500 is about the message, not the load')
  t.equal(pushSignal({ kind: 'rejected', status: 501 }), 'neutral')
  t.equal(pushSignal({ kind: 'rejected', status: 400 }), 'neutral')
  t.equal(pushSignal({ kind: 'rejected', status: 410 }), 'neutral')
  t.equal(pushSignal({ kind: 'rejected', status: 302 }), 'neutral')
  t.equal(pushSignal({ kind: 'timeout' }), 'congested')
  t.equal(pushSignal({ kind: 'network' }), 'congested')
})

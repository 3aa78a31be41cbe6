import t from '../helpers/tap.ts'
import { TokenBucket } from '../../src/http/token-bucket.ts'

t.test('starts full, empties after the burst, says how long to wait', async (t) => {
  const b = new TokenBucket(5, 10, 0)
  for (let i = 0; i < 10; i++) t.equal(b.take(0), 0, `call ${i} of the burst`)
  t.equal(b.take(0), 200, 'one token comes back every 200 ms at 5/s')
  t.equal(b.take(100), 100, 'half-way there')
  t.equal(b.take(200), 0, 'a token is back')
  t.equal(b.take(200), 200, 'and taken again')
})

t.test('refills at the rate, never past the burst', async (t) => {
  const b = new TokenBucket(5, 10, 0)
  for (let i = 0; i < 10; i++) b.take(0)
  t.notOk(b.isFull(1000), 'after 1 s, 5 of 10 tokens')
  t.ok(b.isFull(2000))
  t.ok(b.isFull(60_000))
  let taken = 0
  while (b.take(60_000) === 0) taken++
  t.equal(taken, 10, 'an idle minute still gives only the burst')
})

t.test('time going backwards neither adds nor removes tokens', async (t) => {
  const b = new TokenBucket(1, 2, 10_000)
  t.equal(b.take(10_000), 0)
  t.equal(b.take(5_000), 0)
  t.ok(b.take(5_000) > 0)
})

t.test('fractional rates and bad arguments', async (t) => {
  const b = new TokenBucket(0.5, 1, 0)
  t.equal(b.take(0), 0)
  t.equal(b.take(0), 2000)
  t.throws(() => new TokenBucket(0, 1, 0), RangeError)
  t.throws(() => new TokenBucket(1, 0, 0), RangeError)
})

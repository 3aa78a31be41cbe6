import t from '../helpers/tap.ts'
import { murmur2, partitionForKey, RoundRobin } from '../../src/core/partitioner.ts'

t.test("murmur2 matches Kafka (vectors from Kafka's own UtilsTest)", async (t) => {
  const vectors: [string, number][] = [
    ['21', -973932308],
    ['foobar', -790332482],
    ['a-little-bit-long-string', -985981536],
    ['a-little-bit-longer-string', -1486304829],
    ['lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8', -58897971],
    ['abc', 479470107],
  ]
  for (const [input, expected] of vectors) t.equal(murmur2(Buffer.from(input)), expected, input)
})

t.test('a key maps to one partition in range; keys spread', async (t) => {
  const counts = new Array(8).fill(0)
  for (let i = 0; i < 8000; i++) {
    const p = partitionForKey(`user-${i}`, 8)
    t.equal(p, partitionForKey(`user-${i}`, 8))
    counts[p]++
  }
  for (const c of counts) t.ok(c > 800 && c < 1200, `roughly even: ${c}`)
  t.equal(partitionForKey('ключ-🦊', 1), 0)
})

t.test('round robin cycles through every partition', async (t) => {
  const rr = new RoundRobin()
  const picks = Array.from({ length: 12 }, () => rr.pick(7, 3))
  for (let i = 3; i < 12; i++) t.equal(picks[i], picks[i - 3])
  t.same(new Set(picks.slice(0, 3)).size, 3)
})

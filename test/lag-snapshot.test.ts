/** The /metrics lag snapshot: scrapes served from memory, one read at a time, only while scraped. */
import t from 'tap'
import { LagSnapshot, type PartitionLag } from '../src/lag-snapshot.ts'
import { absenceWindow, waitUntil } from './helpers/wait.ts'

/** A read source whose reads the test lets finish one by one. */
function source() {
  const pending: { resolve(rows: PartitionLag[]): void; reject(err: Error): void }[] = []
  return {
    pending,
    read: () => new Promise<PartitionLag[]>((resolve, reject) => pending.push({ resolve, reject })),
  }
}
const row = (lag: number): PartitionLag[] => [{ groupId: 1, group: 'g', partition: 0, lag }]

t.test('many scrapes cost one read; a stale one starts a read and is served at once; a failure empties the gauges', async (t) => {
  let nowMs = 0
  const errors: unknown[] = []
  const src = source()
  const lags = new LagSnapshot({ read: src.read, refreshMs: 60_000, onError: (e) => errors.push(e), now: () => nowMs })
  t.teardown(() => lags.close())

  const first = lags.forScrape()
  const alsoFirst = lags.forScrape()
  t.equal(src.pending.length, 1, 'scrapes before the first read ends share it')
  src.pending[0]!.resolve(row(7))
  t.same(await first, row(7), 'the first scrape waits for the first read')
  t.same(await alsoFirst, row(7))

  for (let i = 0; i < 100; i++) t.same(await lags.forScrape(), row(7))
  t.equal(src.pending.length, 1, '100 scrapes within refreshMs read nothing')

  nowMs = 60_000
  t.same(await lags.forScrape(), row(7), 'a scrape of stale rows is served the last rows at once')
  t.equal(src.pending.length, 2, 'and starts one read')
  t.same(await lags.forScrape(), row(7))
  t.equal(src.pending.length, 2, 'one read in flight at most')
  src.pending[1]!.resolve(row(3))
  await waitUntil(async () => ((await lags.forScrape())[0]?.lag === 3 ? true : undefined), 5000, 'the new rows served')

  nowMs = 120_000
  await lags.forScrape()
  src.pending[2]!.reject(new Error('database away'))
  await waitUntil(async () => ((await lags.forScrape()).length === 0 ? true : undefined), 5000, 'no stale rows after a failed read')
  t.match(errors, [{ message: 'database away' }])
})

t.test('while scraped, reads go on every refreshMs in the background; never after close', async (t) => {
  let reads = 0
  const lags = new LagSnapshot({
    read: async () => row(++reads),
    refreshMs: 10,
    onError: () => {},
  })
  t.same(await lags.forScrape(), row(1))
  await waitUntil(async () => ((await lags.forScrape())[0]!.lag >= 3 ? true : undefined), 5000, 'two background reads')
  lags.close()
  const after = reads
  await absenceWindow(50) // reads come every 10 ms when they come at all
  t.equal(reads, after, 'closed: no more reads')
})

t.test('no scrape, no read', async (t) => {
  let reads = 0
  const lags = new LagSnapshot({
    read: async () => row(++reads),
    refreshMs: 10,
    onError: () => {},
  })
  t.teardown(() => lags.close())
  await absenceWindow(50) // reads come every 10 ms when they come at all
  t.equal(reads, 0, 'a broker nobody scrapes reads no lag')
})

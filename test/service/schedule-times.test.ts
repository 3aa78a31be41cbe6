import t from '../helpers/tap.ts'
import { planTicks, tickClock, upcoming, type TickClock } from '../../src/service/schedule-times.ts'

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString())
const at = (s: string) => Date.parse(s)
const runs = (clock: TickClock, from: string, n: number) => {
  const out: string[] = []
  let ms: number | null = at(from)
  for (let i = 0; i < n && ms !== null; i++) {
    ms = clock.next(ms)
    if (ms !== null) out.push(iso(ms)!)
  }
  return out
}

// Europe/Berlin in 2026: 02:00 CET becomes 03:00 CEST on Sunday 29 March (01:00Z); 03:00 CEST
// becomes 02:00 CET on Sunday 25 October (01:00Z), so 02:00-02:59 local happens twice.
t.test('a local time the spring change skips does not tick', async (t) => {
  const daily = tickClock({ cron: '30 2 * * *', timeZone: 'Europe/Berlin' })
  t.same(runs(daily, '2026-03-27T12:00:00Z', 3), ['2026-03-28T01:30:00.000Z', '2026-03-30T00:30:00.000Z', '2026-03-31T00:30:00.000Z'])
  const hourly = tickClock({ cron: '0 * * * *', timeZone: 'Europe/Berlin' })
  // 01:00 CET, then 03:00 CEST: no 02:00 that night.
  t.same(runs(hourly, '2026-03-28T23:30:00Z', 3), ['2026-03-29T00:00:00.000Z', '2026-03-29T01:00:00.000Z', '2026-03-29T02:00:00.000Z'])
  t.equal(iso(daily.previous(at('2026-03-30T00:00:00Z'))), '2026-03-28T01:30:00.000Z', 'stepping back skips it too')
})

t.test('a local time the autumn change repeats ticks once', async (t) => {
  const daily = tickClock({ cron: '30 2 * * *', timeZone: 'Europe/Berlin' })
  t.same(runs(daily, '2026-10-24T12:00:00Z', 2), ['2026-10-25T00:30:00.000Z', '2026-10-26T01:30:00.000Z'])
  const hourly = tickClock({ cron: '0 * * * *', timeZone: 'Europe/Berlin' })
  // 02:00 CEST (00:00Z), then 03:00 CET (02:00Z): the second 02:00 (01:00Z) does not tick.
  t.same(runs(hourly, '2026-10-24T23:30:00Z', 3), ['2026-10-25T00:00:00.000Z', '2026-10-25T02:00:00.000Z', '2026-10-25T03:00:00.000Z'])
  const quarter = tickClock({ cron: '0 */15 2 * * *', timeZone: 'Europe/Berlin' })
  t.same(runs(quarter, '2026-10-24T23:59:00Z', 5), [
    '2026-10-25T00:00:00.000Z',
    '2026-10-25T00:15:00.000Z',
    '2026-10-25T00:30:00.000Z',
    '2026-10-25T00:45:00.000Z',
    '2026-10-26T01:00:00.000Z',
  ])
  t.equal(iso(hourly.previous(at('2026-10-25T01:30:00Z'))), '2026-10-25T00:00:00.000Z', 'stepping back skips the second pass')
})

t.test('cron forms: 5 fields, 6 with seconds, names; every on the epoch', async (t) => {
  t.same(runs(tickClock({ cron: '0 9 * * MON-FRI', timeZone: 'UTC' }), '2026-12-04T10:00:00Z', 2), [
    '2026-12-07T09:00:00.000Z',
    '2026-12-08T09:00:00.000Z',
  ])
  t.same(runs(tickClock({ cron: '*/20 0 9 1 JAN *', timeZone: 'America/New_York' }), '2026-12-01T00:00:00Z', 2), [
    '2027-01-01T14:00:00.000Z',
    '2027-01-01T14:00:20.000Z',
  ])
  const every = tickClock({ everyMs: 1500, timeZone: 'Europe/Berlin' })
  t.equal(every.next(0), 1500)
  t.equal(every.next(2999), 3000)
  t.equal(every.next(3000), 4500)
  t.equal(every.previous(3000), 1500)
  t.equal(every.previous(3001), 3000)
  t.same(upcoming(every, 3000, 3), [3000, 4500, 6000])
  t.same(upcoming(every, 3001, 2), [4500, 6000])
})

t.test('bad timings are a 400 invalid_request', async (t) => {
  for (const timing of [
    { cron: '* * * *', timeZone: 'UTC' },
    { cron: '0 0 0 1 1 * 2030', timeZone: 'UTC' },
    { cron: '60 * * * *', timeZone: 'UTC' },
    { cron: 'every day', timeZone: 'UTC' },
    { cron: '0 0 31 2 *', timeZone: 'UTC' },
    { cron: '0 9 * * *', timeZone: 'Mars/Olympus' },
    { everyMs: 1000, timeZone: 'Nowhere' },
  ]) {
    t.throws(() => tickClock(timing), { code: 'invalid_request' }, JSON.stringify(timing))
  }
})

t.test('planTicks: every tick a broker ran through, the missed policy for the rest', async (t) => {
  const every = tickClock({ everyMs: 1000, timeZone: 'UTC' })
  // A broker ran 0-10.5 s (its producer died at 5 s: ticks 5..10 are still due), none 10.5-20 s, one from 20 s.
  const spans = [
    { startMs: 0, endMs: 10_500 },
    { startMs: 20_000, endMs: 30_000 },
  ]
  t.same(planTicks(every, 5000, 22_500, spans, 'skip', 100), {
    ticks: [5000, 6000, 7000, 8000, 9000, 10_000, 20_000, 21_000, 22_000],
    next: 23_000,
  })
  t.same(planTicks(every, 5000, 22_500, spans, 'once', 100), {
    ticks: [5000, 6000, 7000, 8000, 9000, 10_000, 19_000, 20_000, 21_000, 22_000],
    next: 23_000,
  })
  t.same(planTicks(every, 5000, 22_500, spans, 'skip', 3), { ticks: [5000, 6000, 7000], next: 8000 }, 'bounded')
  // No span at all before now's (a first start after a long stop): once is the latest missed.
  t.same(planTicks(every, 1000, 100_500, [{ startMs: 100_200, endMs: 101_000 }], 'once', 100), { ticks: [100_000], next: 101_000 })
  t.same(planTicks(every, 1000, 100_500, [{ startMs: 100_200, endMs: 101_000 }], 'skip', 100), { ticks: [], next: 101_000 })
  t.same(planTicks(every, 1000, 900, spans, 'skip', 100), { ticks: [], next: 1000 }, 'nothing due')
})

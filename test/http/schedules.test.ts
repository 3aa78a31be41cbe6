/**
 * The schedules API in one broker: validation (400s change nothing), 201/200/404/204, nextRuns,
 * pause, ticks arriving with their headers, delete stopping ticks, a topic's deletion taking its
 * schedules. Exactly once across processes and kills: test/process/schedules-kill.test.ts.
 */
import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const app = broker.app

const put = (name: string, body: unknown) => app.inject({ method: 'PUT', url: `/v1/schedules/${name}`, payload: body as object })
const get = (name: string) => app.inject({ url: `/v1/schedules/${name}` })
const topic = (name: string) => app.inject({ method: 'PUT', url: `/v1/topics/${name}`, payload: { partitions: 1 } })

/** The messages of a 1-partition topic. */
async function messages(name: string): Promise<{ key: string | null; value: unknown; headers: Record<string, string> }[]> {
  const res = await app.inject({ url: `/v1/topics/${name}/partitions/0/messages?fromOffset=0&limit=1000` })
  return res.statusCode === 200 ? res.json().messages : []
}

t.test('a bad schedule is a 400 (or 404 for its topic) and changes nothing', async (t) => {
  await topic('reports')
  const good = { topic: 'reports', cron: '0 9 * * 1-5', timeZone: 'Europe/Berlin', message: { value: { r: 1 } } }
  t.equal((await put('weekday', good)).statusCode, 201)
  const before = (await get('weekday')).json()
  for (const [body, code, status] of [
    [{ ...good, cron: '0 9 * *' }, 'invalid_request', 400],
    [{ ...good, cron: '0 25 * * *' }, 'invalid_request', 400],
    [{ ...good, timeZone: 'Europe/Atlantis' }, 'invalid_request', 400],
    [{ ...good, every: 60000 }, 'invalid_request', 400],
    [{ topic: 'reports', message: { value: 1 } }, 'invalid_request', 400],
    [{ topic: 'reports', every: 999, message: { value: 1 } }, 'invalid_request', 400],
    [{ ...good, missed: 'all' }, 'invalid_request', 400],
    [{ ...good, message: { value: 1, headers: { 'Hookq-DLQ-Source-Topic': 'orders' } } }, 'invalid_request', 400],
    [{ ...good, extra: true }, 'invalid_request', 400],
    [{ ...good, message: { value: 1, headers: { h: 1 } } }, 'invalid_request', 400],
    [{ ...good, topic: 'nope' }, 'topic_not_found', 404],
  ] as const) {
    const res = await put('weekday', body)
    t.equal(res.statusCode, status, JSON.stringify(body))
    t.match(res.json(), { code, status })
    t.match(res.headers['content-type'], /^application\/problem\+json/)
  }
  t.same((await get('weekday')).json(), before, 'the schedule is as it was')
  t.equal((await put('bad name!', good)).statusCode, 400)
  t.match((await get('unknown')).json(), { status: 404, code: 'schedule_not_found' })
  t.match((await app.inject({ method: 'DELETE', url: '/v1/schedules/unknown' })).json(), { status: 404, code: 'schedule_not_found' })
})

t.test('the view: fields, nextRuns in the zone, paused, list', async (t) => {
  await topic('reports')
  const created = await put('berlin-nine', {
    topic: 'reports',
    cron: '0 9 * * MON-FRI',
    timeZone: 'Europe/Berlin',
    message: { value: 'go', key: 'k', headers: { a: 'b' } },
    missed: 'once',
  })
  t.equal(created.statusCode, 201)
  const view = created.json()
  t.match(view, {
    name: 'berlin-nine',
    topic: 'reports',
    cron: '0 9 * * MON-FRI',
    timeZone: 'Europe/Berlin',
    message: { value: 'go', key: 'k', headers: { a: 'b' } },
    paused: false,
    missed: 'once',
    lastTickAt: null,
  })
  t.notOk('every' in view)
  t.equal(view.nextRuns.length, 5)
  for (const run of view.nextRuns) {
    const d = new Date(run)
    const local = new Intl.DateTimeFormat('en-GB', {
      timeZone: 'Europe/Berlin',
      hour: '2-digit',
      minute: '2-digit',
      weekday: 'short',
    }).format(d)
    t.match(local, /^(Mon|Tue|Wed|Thu|Fri) 09:00$/, `${run} is 09:00 on a weekday in Berlin`)
    t.ok(d.getTime() > Date.now())
  }
  t.same([...view.nextRuns].sort(), view.nextRuns, 'in order')

  const paused = await put('berlin-nine', {
    topic: 'reports',
    cron: '0 9 * * MON-FRI',
    timeZone: 'Europe/Berlin',
    message: { value: 'go' },
    paused: true,
  })
  t.equal(paused.statusCode, 200)
  t.match(paused.json(), { paused: true, nextRuns: [], missed: 'skip', message: { value: 'go' } })
  t.notOk('key' in paused.json().message, 'replaced whole')

  const every = (await put('every-hour', { topic: 'reports', every: 3_600_000, message: { value: null } })).json()
  t.match(every, { every: 3_600_000, timeZone: 'UTC', message: { value: null } })
  t.equal(Date.parse(every.nextRuns[0]) % 3_600_000, 0, 'on the epoch plus multiples of every')
  t.equal(Date.parse(every.nextRuns[1]) - Date.parse(every.nextRuns[0]), 3_600_000)

  const list = (await app.inject({ url: '/v1/schedules' })).json()
  const names = list.schedules.map((s: { name: string }) => s.name)
  t.ok(names.indexOf('berlin-nine') >= 0 && names.indexOf('every-hour') > names.indexOf('berlin-nine'), 'listed by name')
})

t.test('ticks produce one message each with the headers; pause, delete and a topic delete stop them', async (t) => {
  await topic('ticks')
  const res = await put('each-second', { topic: 'ticks', every: 1000, message: { value: { n: 1 }, key: 'kk', headers: { x: 'y' } } })
  t.equal(res.statusCode, 201)
  const firstRun = Date.parse(res.json().nextRuns[0])
  const got = await waitUntil(
    async () => {
      const m = await messages('ticks')
      return m.length >= 2 ? m : null
    },
    15_000,
    'two ticks',
  )
  t.match(got[0], { key: 'kk', value: { n: 1 }, headers: { x: 'y', 'hookq-schedule': 'each-second', 'hookq-schedule-tick': String } })
  const ticks = got.map((m) => m.headers['hookq-schedule-tick']!)
  t.equal(Date.parse(ticks[0]!), firstRun, 'the first tick is the first of nextRuns')
  t.match(ticks[0], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.000Z$/)
  t.equal(Date.parse(ticks[1]!) - Date.parse(ticks[0]!), 1000, 'one message per tick, in order')
  const view = (await get('each-second')).json()
  t.ok(Date.parse(view.lastTickAt) >= Date.parse(ticks[1]!), 'lastTickAt follows the ticks')
  const metrics = (await app.inject({ url: '/metrics' })).body
  t.match(metrics, /hookq_messages_produced_total\{topic="ticks"\} [1-9]/, 'ticks count as produced messages')

  // Paused: nothing more; resumed: no catch-up of the paused ticks.
  await put('each-second', { topic: 'ticks', every: 1000, message: { value: { n: 1 } }, paused: true })
  const pausedAt = Date.now()
  const countPaused = (await messages('ticks')).length
  await absenceWindow(2500)
  t.equal((await messages('ticks')).length, countPaused, 'no tick while paused')
  await put('each-second', { topic: 'ticks', every: 1000, message: { value: { n: 2 } } })
  const resumed = await waitUntil(
    async () => {
      const m = await messages('ticks')
      return m.length > countPaused ? m : null
    },
    15_000,
    'a tick after resuming',
  )
  const firstAfter = Date.parse(resumed[countPaused]!.headers['hookq-schedule-tick']!)
  t.ok(firstAfter > pausedAt + 2000, 'the ticks passed while paused are not made')

  // Delete: no tick after the answer.
  t.equal((await app.inject({ method: 'DELETE', url: '/v1/schedules/each-second' })).statusCode, 204)
  const deletedAt = Date.now()
  await absenceWindow(2500)
  const after = await messages('ticks')
  t.notOk(
    after.some((m) => Date.parse(m.headers['hookq-schedule-tick']!) > deletedAt),
    'no tick after the delete was answered',
  )
  t.equal((await get('each-second')).statusCode, 404)

  // Deleting the topic deletes its schedules.
  await put('on-ticks', { topic: 'ticks', cron: '0 0 1 1 *', message: { value: 1 } })
  t.equal((await get('on-ticks')).statusCode, 200)
  t.equal((await app.inject({ method: 'DELETE', url: '/v1/topics/ticks' })).statusCode, 204)
  t.match((await get('on-ticks')).json(), { code: 'schedule_not_found' })
})

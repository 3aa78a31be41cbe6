/** The CLI's schedules commands against a real broker over HTTP (its own file: the admin file is long already). */
import t from '../helpers/tap.ts'
import { createClient, unwrap } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { runCli } from './run.ts'

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
const cli = (...args: string[]) => runCli(args, { url })

t.test('schedules put, list, get (a table of the next runs) and delete', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'reports' } }, body: { partitions: 1 } }))
  const put = await cli(
    'schedules',
    'put',
    'nine',
    '--topic',
    'reports',
    '--cron',
    '0 9 * * MON-FRI',
    '-z',
    'Europe/Berlin',
    '-v',
    '{"r":1}',
    '-H',
    'a=b',
  )
  t.equal(put.code, 0, put.stderr)
  t.match(put.stdout, /^created: schedule nine, cron '0 9 \* \* MON-FRI' to topic reports/)
  const got = await cli('schedules', 'get', 'nine')
  t.equal(got.code, 0, got.stderr)
  const lines = got.stdout.trim().split('\n')
  t.match(lines[0], /^schedule nine: cron '0 9 \* \* MON-FRI' \(Europe\/Berlin\) to topic reports, missed: skip, last tick none yet$/)
  t.match(lines[1], /^NEXT RUN \(UTC\)\s+LOCAL \(EUROPE\/BERLIN\)$/i)
  const runs = lines.slice(2)
  t.equal(runs.length, 5, 'five next runs')
  for (const run of runs) t.match(run, /^\d{4}-\d\d-\d\dT0[78]:00:00\.000Z\s+\d{4}-\d\d-\d\d 09:00:00$/)

  await cli('schedules', 'put', 'often', '--topic', 'reports', '--every', '3600000', '-v', '1', '--paused', '--missed', 'once')
  const list = await cli('schedules', 'list')
  t.equal(list.code, 0, list.stderr)
  t.match(list.stdout, /^NAME\s+TOPIC\s+TIMING\s+TIME ZONE\s+NEXT RUN\s+LAST TICK/)
  t.match(list.stdout, /\noften\s+reports\s+every 1h\s+UTC\s+paused\s+-/)
  t.match(list.stdout, /\nnine\s+reports\s+cron '0 9 \* \* MON-FRI'\s+Europe\/Berlin\s+\d{4}-/)
  const json = JSON.parse((await cli('--json', 'schedules', 'get', 'often')).stdout)
  t.match(json, { name: 'often', every: 3_600_000, paused: true, missed: 'once', nextRuns: [] })

  const bad = await cli('schedules', 'put', 'nine', '--topic', 'reports', '--cron', '0 9 * *', '-v', '1')
  t.equal(bad.code, 1, 'the broker refuses it')
  t.match(bad.stderr, /needs 5, or 6/)
  t.equal((await cli('schedules', 'delete', 'nine')).code, 0)
  t.equal((await hookq.GET('/v1/schedules/{name}', { params: { path: { name: 'nine' } } })).response.status, 404, 'gone')
})

/**
 * The CLI's message commands against a real broker: produce from arguments and from stdin (checked
 * through the API), a bad stdin line, tail with and without --follow, and the attempt log after
 * pushes to a real receiver.
 */
import t from '../helpers/tap.ts'
import { createClient, unwrap, type Message } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli, startCli } from './run.ts'

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
// The tests run side by side on the one broker, each on topics (and a front) of its own: most of
// their time is CLI processes starting, which need not wait for another test's.
t.jobs = 4
const cli = (args: string[], stdin?: string) => runCli(args, { url, ...(stdin === undefined ? {} : { stdin }) })
const createTopic = (topic: string, partitions: number) =>
  unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic } }, body: { partitions } }))
const read = async (topic: string, partition: number, fromOffset = 0): Promise<Message[]> =>
  (
    await unwrap(
      hookq.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
        params: { path: { topic, partition }, query: { fromOffset, limit: 1000 } },
      }),
    )
  ).messages

t.test('produce from arguments, with key, headers and partition', async (t) => {
  await createTopic('events', 2)
  const run = await cli([
    'produce',
    'events',
    '{"a":1}',
    '"text"',
    '[1,2]',
    '--key',
    'user-7',
    '-H',
    'source=cli',
    '-H',
    'trace=x=y',
    '--partition',
    '1',
  ])
  t.equal(run.code, 0, run.stderr)
  t.match(run.stdout, /^produced 3 messages to events\n/)
  t.match(run.stdout, /PARTITION\s+OFFSET\s+DUPLICATE\n1\s+0\s*\n1\s+1\s*\n1\s+2/)
  const stored = await read('events', 1)
  t.same(
    stored.map((m) => m.value),
    [{ a: 1 }, 'text', [1, 2]],
  )
  t.ok(
    stored.every((m) => m.key === 'user-7'),
    'every message has the key',
  )
  t.same(stored[0]!.headers, { source: 'cli', trace: 'x=y' }, 'a header value may contain =')

  const bad = await cli(['produce', 'events', '{"ok":true}', 'not-json'])
  t.equal(bad.code, 2, 'a value that is not JSON is a usage error')
  t.match(bad.stderr, /argument 2 is not valid JSON/)
  t.equal((await read('events', 0)).length + (await read('events', 1)).length, 3, 'and nothing of that call was sent')

  const one = await cli(['produce', 'events', '{"b":1}'])
  t.match(one.stdout, /^produced 1 message to events\n/, 'one message, singular')
})

t.test('produce NDJSON from stdin in batches; a bad line stops it and says how far it got', async (t) => {
  await createTopic('bulk', 1)
  const lines = Array.from({ length: 25 }, (_, i) => JSON.stringify({ i }))
  const run = await cli(['--json', 'produce', 'bulk', '--batch-size', '10', '--idempotency-prefix', 'load-1'], `${lines.join('\n')}\n\n`)
  t.equal(run.code, 0, run.stderr)
  const answer = JSON.parse(run.stdout) as { produced: number; duplicates: number; results: Array<{ offset: number }> }
  t.equal(answer.produced, 25)
  t.same(
    answer.results.map((r) => r.offset),
    Array.from({ length: 25 }, (_, i) => i),
  )
  t.same(
    (await read('bulk', 0)).map((m) => m.value),
    Array.from({ length: 25 }, (_, i) => ({ i })),
    'every line, in order',
  )

  // Lines 1-10 and 11-20 go in two calls before line 24 is read; 21-23 wait in the third and are not sent.
  const broken = [...lines.slice(0, 23), '{"i": oops}', ...lines.slice(24)].join('\n')
  const stopped = await cli(['produce', 'bulk', '--batch-size', '10', '--idempotency-prefix', 'load-2'], broken)
  t.equal(stopped.code, 2)
  t.match(stopped.stderr, /line 24 is not valid JSON/)
  t.match(stopped.stderr, /20 messages were committed \(lines 1 to 20\); nothing after line 20 was sent/)
  t.equal((await read('bulk', 0)).length, 45, 'exactly the 20 it reported')

  // The same input again with the same prefix: the committed 20 are duplicates, the rest is new.
  const resent = await cli(['--json', 'produce', 'bulk', '--idempotency-prefix', 'load-2'], lines.join('\n'))
  t.equal(resent.code, 0, resent.stderr)
  t.match(JSON.parse(resent.stdout), { produced: 5, duplicates: 20 })
  t.equal((await read('bulk', 0)).length, 50)
})

t.test('tail: a partition from an offset, the last messages as NDJSON, and --follow until Ctrl-C', async (t) => {
  await createTopic('feed', 1)
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'feed' } },
      body: { messages: [{ value: { n: 0 }, key: 'k' }, { value: { n: 1 }, headers: { h: 'v' } }, { value: { n: 2 } }] },
    }),
  )

  const from = await cli(['tail', 'feed', '--from', '1'])
  t.equal(from.code, 0, from.stderr)
  const lines = from.stdout.trim().split('\n')
  t.equal(lines.length, 2)
  t.match(lines[0], /^0:1 \d{4}-\S+Z key=- \{"n":1\} headers=\{"h":"v"\}$/)
  t.match(lines[1], /^0:2 \S+ key=- \{"n":2\}$/)

  const last = await cli(['tail', 'feed', '--json', '--last', '2'])
  const ndjson = last.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Message)
  t.same(
    ndjson.map((m) => [m.offset, m.value]),
    [
      [1, { n: 1 }],
      [2, { n: 2 }],
    ],
  )

  // From offset 3 (the end), so the message produced below is the first one printed, whenever tail starts.
  const follow = startCli(t, ['tail', 'feed', '--follow', '--from', '3', '--max-poll-ms', '200'], { url })
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'feed' } }, body: { messages: [{ value: 'live', key: 'k2' }] } }),
  )
  await follow.waitForOutput('key=k2 "live"')
  t.match(follow.stdout(), /^0:3 \S+ key=k2 "live"\n$/, 'only the new message')
  t.equal(await follow.stop('SIGINT'), 0, 'Ctrl-C ends a follow with exit code 0')
})

t.test('deliveries: the attempt log after pushes to a real receiver, one page and --all', async (t) => {
  await createTopic('orders', 1)
  const receiver = await startReceiver(t, { status: 200 })
  await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'billing' } }, body: { topic: 'orders', ackMode: 'auto' } }))
  await unwrap(
    hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'billing' } }, body: { url: `${receiver.url}/hook` } }),
  )
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'orders' } },
      body: { messages: [{ value: 1 }, { value: 2 }, { value: 3 }] },
    }),
  )
  await receiver.waitFor(3, 15_000)
  await waitUntil(
    async () => {
      const log = await unwrap(
        hookq.GET('/v1/groups/{group}/deliveries', { params: { path: { group: 'billing' }, query: { outcome: 'acked' } } }),
      )
      return log.deliveries.length === 3
    },
    15_000,
    'three acked attempts',
  )

  const page = await cli(['deliveries', 'billing', '--limit', '2'])
  t.equal(page.code, 0, page.stderr)
  const rows = page.stdout.trim().split('\n')
  t.match(rows[0], /^STARTED\s+MESSAGE\s+ATTEMPT\s+OUTCOME\s+STATUS/)
  t.equal(rows.length, 3, 'a header and two attempts')
  t.match(rows[1], /\s0:\d\s+1\s+acked\s+200\s/, 'message, attempt, outcome, status')
  t.match(page.stderr, /more attempts: --cursor \S+/)

  const all = await cli(['--json', 'deliveries', 'billing', '--all', '--limit', '1', '--outcome', 'acked'])
  t.equal(all.code, 0, all.stderr)
  const log = JSON.parse(all.stdout) as { deliveries: Array<{ offset: number; outcome: string }>; nextCursor: string | null }
  t.same(log.deliveries.map((d) => d.offset).sort(), [0, 1, 2], 'three pages of one, followed to the end')
  t.equal(log.nextCursor, null)
})

t.test("deliveries: a consumer's error text is shown escaped, never as terminal control sequences", async (t) => {
  await createTopic('hostile', 1)
  // The answer tries to colour the terminal, retitle the window, ring the bell and reverse the text.
  const body = 'no\u001b[31m red\u001b]0;pwned\u0007 \u202etxt.exe\r\u0000 end\\x'
  const receiver = await startReceiver(t, { status: 500, body })
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'hostile-g' } },
      body: { topic: 'hostile', ackMode: 'auto', maxDeliveries: 1 },
    }),
  )
  await unwrap(
    hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: 'hostile-g' } }, body: { url: `${receiver.url}/hook` } }),
  )
  await unwrap(hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'hostile' } }, body: { messages: [{ value: 1 }] } }))
  await waitUntil(
    async () => {
      const log = await unwrap(hookq.GET('/v1/groups/{group}/deliveries', { params: { path: { group: 'hostile-g' } } }))
      return log.deliveries.some((d) => d.error !== null)
    },
    15_000,
    'the failed attempt recorded',
  )

  const run = await cli(['deliveries', 'hostile-g'])
  t.equal(run.code, 0, run.stderr)
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the characters that must not reach a terminal
  t.notOk(/[\u0000-\u0008\u000b-\u001f\u007f\u202e]/.test(run.stdout), 'no control character reaches the terminal')
  // (The broker stores NUL as U+FFFD: PostgreSQL text cannot hold it.)
  t.match(run.stdout, 'HTTP 500: no\\x1b[31m red\\x1b]0;pwned\\x07 \\u202etxt.exe\\r\uFFFD end\\\\x', 'each one is shown escaped')
  const json = JSON.parse((await cli(['--json', 'deliveries', 'hostile-g'])).stdout) as { deliveries: Array<{ error: string | null }> }
  t.equal(json.deliveries[0]!.error, `HTTP 500: ${body.replace('\u0000', '\uFFFD')}`, '--json keeps the text as stored')
})

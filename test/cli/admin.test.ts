/**
 * The CLI's admin commands against a real broker over HTTP: topics, groups, consumers and seek,
 * in tables and in --json, and the exit codes of its failures (broker error 1, usage 2,
 * unreachable 3, missing API key 1 with the 401 explained).
 */
import t from '../helpers/tap.ts'
import { createServer } from 'node:net'
import { createClient, unwrap } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { runCli } from './run.ts'

// About thirty CLI processes, each a Node start: 150 s here alone, past tap's 180 s per file when
// the machine is busy (CI runs six test files at once), where nothing was wrong but the clock.
t.setTimeout(600_000)

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
const cli = (...args: string[]) => runCli(args, { url })

t.test('topics create, list (table and --json), show and delete', async (t) => {
  const created = await cli('topics', 'create', 'orders', '--partitions', '3')
  t.equal(created.code, 0, created.stderr)
  t.match(created.stdout, /^created: topic orders with 3 partitions/)
  t.equal((await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'orders' } } }))).partitions, 3, 'the broker has it')

  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'audit' } }, body: { partitions: 1, retentionMs: 3_600_000 } }))
  // Reads run at once (each CLI command is a Node process of its own); the delete after them.
  const [table, json, shown] = await Promise.all([cli('topics', 'list'), cli('--json', 'topics', 'list'), cli('topics', 'show', 'audit')])
  t.equal(table.code, 0)
  const lines = table.stdout.trim().split('\n')
  t.match(lines[0], /^NAME\s+PARTITIONS\s+RETENTION\s+CREATED$/)
  t.match(
    lines.find((l) => l.startsWith('audit')),
    /^audit\s+1\s+1h\s+\d{4}-/,
  )
  t.match(
    lines.find((l) => l.startsWith('orders')),
    /^orders\s+3\s+7d\s+/,
  )

  t.equal(json.code, 0)
  const listed = JSON.parse(json.stdout) as { topics: Array<{ name: string; partitions: number }> }
  t.same(listed.topics.map((x) => [x.name, x.partitions]).sort(), [
    ['audit', 1],
    ['orders', 3],
  ])

  t.match(shown.stdout, /^topic audit: 1 partition, retention 1h,/, 'one partition, singular')

  const deleted = await cli('topics', 'delete', 'audit', '--json')
  t.same(JSON.parse(deleted.stdout), { deleted: 'audit' })
  t.equal((await hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'audit' } } })).response.status, 404)
})

t.test('groups create and status; consumers add, list and remove', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'jobs' } }, body: { partitions: 2 } }))
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'jobs.dlq' } }, body: { partitions: 1 } }))
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'jobs' } },
      body: {
        messages: [
          { value: 1, partition: 1 },
          { value: 2, partition: 1 },
        ],
      },
    }),
  )

  const created = await cli(
    'groups',
    'create',
    'workers',
    '--topic',
    'jobs',
    '--ack-mode',
    'auto',
    '--max-deliveries',
    '3',
    '--dead-letter-topic',
    'jobs.dlq',
    '--retry-initial-delay-ms',
    '250',
    '--retry-jitter',
    '0',
    '--paused',
    '--filter',
    '{"value.n":{"gte":1}}',
    '--ordering',
    'key',
    '--batch-max-messages',
    '10',
    '--batch-max-wait-ms',
    '5',
  )
  t.equal(created.code, 0, created.stderr)
  t.match(created.stdout, /^created: group workers on topic jobs/)
  const group = await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'workers' } } }))
  t.match(group, {
    ordering: 'key',
    batch: { maxMessages: 10, maxWaitMs: 5, maxBytes: null },
    filter: { 'value.n': { gte: 1 } },
    ackMode: 'auto',
    maxDeliveries: 3,
    deadLetterTopic: 'jobs.dlq',
    paused: true,
    retry: { initialDelayMs: 250, jitter: 0, multiplier: 2 },
  })

  // A receiver is not needed: the group is paused, so the consumer is registered and never pushed to.
  const added = await cli('--json', 'consumers', 'add', 'workers', 'http://127.0.0.1:9/hook')
  t.equal(added.code, 0, added.stderr)
  const consumer = JSON.parse(added.stdout) as { id: string; url: string }
  t.equal(consumer.url, 'http://127.0.0.1:9/hook')

  const status = await cli('groups', 'status', 'workers')
  t.equal(status.code, 0, status.stderr)
  t.match(status.stdout, /group workers on topic jobs \(PAUSED\)/)
  t.match(status.stdout, '  filter {"value.n":{"gte":1}}')
  t.match(status.stdout, '  batch push: up to 10 messages, wait 5 ms')
  t.match(status.stdout, 'ordered by key')
  t.equal((await cli('groups', 'update', 'workers', '--topic', 'jobs', '--no-batch')).code, 0)
  t.equal(
    (await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'workers' } } }))).batch,
    null,
    '--no-batch turns it off',
  )
  t.match(status.stdout, /PARTITION\s+COMMITTED\s+END\s+LAG\s+IN FLIGHT\s+FILTERED\s+CONSUMER/)
  t.match(
    status.stdout,
    new RegExp(`\\n1\\s+0\\s+2\\s+2\\s+0\\s+0\\s+${consumer.id}`),
    'partition 1: committed 0, end 2, lag 2, owned by the consumer',
  )
  t.match(status.stdout, new RegExp(`${consumer.id}\\s+http://127\\.0\\.0\\.1:9/hook\\s+no\\s+active`))

  const listed = await cli('consumers', 'list', 'workers')
  t.match(listed.stdout, consumer.id)

  const limited = await cli(
    '--json',
    'consumers',
    'add',
    'workers',
    'http://127.0.0.1:9/limited',
    '--rate-limit',
    '5',
    '--max-concurrency',
    '2',
  )
  t.equal(limited.code, 0, limited.stderr)
  const limitedId = (JSON.parse(limited.stdout) as { id: string }).id
  t.match(JSON.parse(limited.stdout), { rateLimitPerSecond: 5, maxConcurrency: 2 })
  t.match(
    (await cli('consumers', 'list', 'workers')).stdout,
    new RegExp(`${limitedId}\\s+http://127\\.0\\.0\\.1:9/limited\\s+no\\s+-\\s+5/s, ≤2 at once`),
  )
  const updated = await cli('consumers', 'update', 'workers', limitedId, '--rate-limit', 'none', '--endpoint', 'http://127.0.0.1:9/moved')
  t.equal(updated.code, 0, updated.stderr)
  t.match(updated.stdout, `updated: consumer ${limitedId} of group workers → http://127.0.0.1:9/moved (≤2 at once)`)
  t.equal((await cli('consumers', 'update', 'workers', limitedId, '--max-concurrency', '0')).code === 0, false, 'a bad limit is refused')
  t.equal((await cli('consumers', 'remove', 'workers', limitedId)).code, 0)

  const removed = await cli('consumers', 'remove', 'workers', consumer.id)
  t.equal(removed.code, 0, removed.stderr)
  t.same((await unwrap(hookq.GET('/v1/groups/{group}/consumers', { params: { path: { group: 'workers' } } }))).consumers, [])
})

t.test('seek to an offset on one partition, and to a time on all', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'ledger' } }, body: { partitions: 2 } }))
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'ledger' } },
      body: { messages: [0, 1, 2].map((n) => ({ value: n, partition: 0 })) },
    }),
  )
  await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'books' } }, body: { topic: 'ledger', paused: true } }))

  const moved = await cli('seek', 'books', '--partition', '0', '--offset', '2')
  t.equal(moved.code, 0, moved.stderr)
  t.match(moved.stdout, /\n0\s+2\n1\s+0/)
  const committed = async () =>
    (await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'books' } } }))).partitions.map((p) => p.committedOffset)
  t.same(await committed(), [2, 0])

  const future = await cli('--json', 'seek', 'books', '--timestamp', new Date(Date.now() + 3_600_000).toISOString())
  t.equal(future.code, 0, future.stderr)
  t.same(
    JSON.parse(future.stdout).partitions,
    [
      { partition: 0, committedOffset: 3 },
      { partition: 1, committedOffset: 0 },
    ],
    'a time after every message: the end offsets',
  )
  t.same(await committed(), [3, 0])

  const both = await cli('seek', 'books', '--offset', '0', '--timestamp', '2026-01-01T00:00:00Z')
  t.equal(both.code, 2, 'both targets is a usage error')
  t.match(both.stderr, /exactly one of --offset and --timestamp/)
  t.same(await committed(), [3, 0], 'and nothing moved')
})

t.test('errors: broker error 1, usage 2, unreachable 3', async (t) => {
  const port = await closedPort()
  // Each a failure that changes nothing, so they run at once.
  const [missing, missingJson, usage, unknown, unreachable] = await Promise.all([
    cli('topics', 'show', 'nope'),
    cli('--json', 'topics', 'show', 'nope'),
    cli('topics', 'create', 'x', '--partitions', 'many'),
    cli('topicz', 'list'),
    runCli(['topics', 'list'], { url: `http://127.0.0.1:${port}` }),
  ])
  t.equal(missing.code, 1)
  t.equal(missing.stdout, '')
  t.match(missing.stderr, /^hookq: topic_not_found \(HTTP 404\): .*nope/)
  t.notMatch(missing.stderr, /\n\s+at /, 'no stack trace')

  t.equal(missingJson.code, 1)
  t.match(JSON.parse(missingJson.stderr), { error: { status: 404, code: 'topic_not_found' } })

  t.equal(usage.code, 2)
  t.match(usage.stderr, /--partitions <n>.*invalid/)
  t.equal((await hookq.GET('/v1/topics/{topic}', { params: { path: { topic: 'x' } } })).response.status, 404, 'nothing was created')

  t.equal(unknown.code, 2, 'an unknown command')

  t.equal(unreachable.code, 3)
  t.match(unreachable.stderr, `cannot reach the broker at http://127.0.0.1:${port}`)
  t.match(unreachable.stderr, /ECONNREFUSED/)
})

t.test('with API keys: a missing key is a 401 explained, HOOKQ_API_KEY or --api-key pass', async (t) => {
  const key = 'cli-test-key-0123456789'
  const secured = await startListeningBroker(t, { HOOKQ_API_KEYS: `${key}:admin` })
  const [without, withEnv] = await Promise.all([
    runCli(['topics', 'list'], { url: secured.url }),
    runCli(['topics', 'create', 'secure', '-p', '1'], { url: secured.url, env: { HOOKQ_API_KEY: key } }),
  ])
  t.equal(without.code, 1)
  t.match(without.stderr, /unauthorized \(HTTP 401\)/)
  t.match(without.stderr, /HOOKQ_API_KEY/)

  t.equal(withEnv.code, 0, withEnv.stderr)
  const withFlag = await runCli(['--api-key', key, '--json', 'topics', 'list'], { url: secured.url })
  t.equal(withFlag.code, 0, withFlag.stderr)
  t.same(
    JSON.parse(withFlag.stdout).topics.map((x: { name: string }) => x.name),
    ['secure'],
  )
})

/** A port nothing listens on: bound, then released. */
async function closedPort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as { port: number }).port
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}

t.test('consumers add --secret: generate makes one and prints it once; a bad one is refused with the hint', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'signed' } }, body: { partitions: 1 } }))
  await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'signed' } }, body: { topic: 'signed' } }))

  // docs/cli.md's placeholder, as a newcomer pastes it
  const bad = await cli('consumers', 'add', 'signed', 'http://127.0.0.1:9/hook', '--secret', 'whsec_...')
  t.equal(bad.code, 2, 'a usage error, refused before the broker is asked')
  t.equal(bad.stderr.trim().split('\n').length, 1, `one line: ${bad.stderr}`)
  t.match(bad.stderr, /whsec_ followed by the base64 of 24 to 64 random bytes/, 'what is expected, once')
  t.notMatch(bad.stderr, /whsec_\.\.\./, 'the value given is not echoed (it may be a real secret, mistyped)')
  t.match(bad.stderr, /--secret generate/, 'says how to make one')
  t.same(
    (await unwrap(hookq.GET('/v1/groups/{group}/consumers', { params: { path: { group: 'signed' } } }))).consumers,
    [],
    'nothing registered',
  )

  const made = await cli('consumers', 'add', 'signed', 'http://127.0.0.1:9/hook', '--secret', 'generate')
  t.equal(made.code, 0, made.stderr)
  const secret = /(whsec_[A-Za-z0-9+/=]+)/.exec(made.stdout)?.[1]
  t.ok(secret, `the secret printed: ${made.stdout}`)
  t.equal(Buffer.from(secret!.slice('whsec_'.length), 'base64').length, 32, '32 random bytes')
  t.equal(made.stdout.split(secret!).length - 1, 1, 'printed once')
  const [consumer] = (await unwrap(hookq.GET('/v1/groups/{group}/consumers', { params: { path: { group: 'signed' } } }))).consumers
  t.equal(consumer?.hasSecret, true, 'registered with it')

  const json = await cli('--json', 'consumers', 'add', 'signed', 'http://127.0.0.1:9/other', '--secret', 'generate')
  t.equal(json.code, 0, json.stderr)
  t.match(JSON.parse(json.stdout), { hasSecret: true, secret: /^whsec_[A-Za-z0-9+/]{43}=$/ }, '--json carries it as secret')
})

t.test("a broker's validation error prints its pattern once (the detail already says it)", async (t) => {
  const res = await cli('groups', 'create', 'g-bad', '--topic', 'no such name!')
  t.not(res.code, 0)
  t.equal((res.stderr.match(/must match pattern/g) ?? []).length, 1, `said once: ${res.stderr}`)
})

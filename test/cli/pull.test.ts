/**
 * `hookq pull <group>`: prints leased messages (a line each, the envelope with --json); without
 * --ack they stay leased, with --ack the group's messages are taken; a push group is refused.
 */
import t from 'tap'
import { createClient, unwrap } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli, startCli } from './run.ts'

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'cli-jobs' } }, body: { partitions: 1 } }))
await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'cli-pull' } }, body: { topic: 'cli-jobs', delivery: 'pull' } }))
await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: 'cli-push' } }, body: { topic: 'cli-jobs' } }))
await unwrap(
  hookq.POST('/v1/topics/{topic}/messages', {
    params: { path: { topic: 'cli-jobs' } },
    body: { messages: [{ key: 'a', value: { n: 1 } }, { value: 'two' }, { value: 3 }] },
  }),
)

t.test('pull prints the leases; --ack takes the messages', async (t) => {
  const first = await runCli(['pull', 'cli-pull', '--max', '2', '--wait', '5000', '--json'], { url })
  t.equal(first.code, 0, first.stderr)
  const leased = first.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { offset: number; attempt: number; deliveryId: string })
  t.ok(leased.length >= 1 && leased.length <= 2, 'at most --max messages')
  t.ok(leased.every((m) => m.attempt === 1 && typeof m.deliveryId === 'string'))
  const rest = await runCli(['pull', 'cli-pull', '--max', '10', '--ack'], { url })
  t.equal(rest.code, 0, rest.stderr)
  const lines = rest.stdout
    .trim()
    .split('\n')
    .filter((l) => l !== '')
  t.equal(lines.length, 3 - leased.length, 'the others: the first pull still holds its leases')
  t.match(rest.stderr, /leased and acked/)
  for (const line of lines) t.match(line, /^0\/\d+ #1 /)
})

t.test('a push group is refused with exit code 1', async (t) => {
  const r = await runCli(['pull', 'cli-push'], { url })
  t.equal(r.code, 1)
  t.match(r.stderr, /push_group/)
})

t.test('--follow asks again when the broker sheds pulls (429) and goes on once it has room', async (t) => {
  const { url: small } = await startListeningBroker(t, { HOOKQ_MAX_WAITING_PULLS: '1' })
  const c = createClient({ baseUrl: small, apiKey: '' })
  await unwrap(c.PUT('/v1/topics/{topic}', { params: { path: { topic: 'cli-shed' } }, body: { partitions: 1 } }))
  await unwrap(c.PUT('/v1/groups/{group}', { params: { path: { group: 'cli-shed-g' } }, body: { topic: 'cli-shed', delivery: 'pull' } }))
  // Another caller's long poll takes the one place.
  const other = new AbortController()
  const waiting = fetch(`${small}/v1/groups/cli-shed-g/pull`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ waitMs: 20_000 }),
    signal: other.signal,
  }).catch(() => undefined)
  await waitUntil(
    async () => (await (await fetch(`${small}/metrics`)).text()).includes('hookq_pulls_waiting 1'),
    30_000,
    'the long poll waits',
  )
  const cli = startCli(t, ['pull', 'cli-shed-g', '--follow', '--ack'], { url: small })
  await waitUntil(() => cli.stderr().includes('asking again'), 60_000, 'the CLI told 429')
  other.abort()
  await waiting
  await unwrap(
    c.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'cli-shed' } }, body: { messages: [{ value: 'after the shed' }] } }),
  )
  await cli.waitForOutput('after the shed')
  t.match(cli.stderr(), /too_many_pulls/, 'it said why it waited')
  t.equal(await cli.stop('SIGINT'), 0, 'Ctrl-C ends the follow')
})

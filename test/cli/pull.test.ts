/**
 * `hookq pull <group>`: prints leased messages (a line each, the envelope with --json); without
 * --ack they stay leased, with --ack the group's messages are taken; a push group is refused.
 */
import net from 'node:net'
import t from '../helpers/tap.ts'
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

t.test('Ctrl-C while the answer of a pull is arriving: what it leased is printed and acked, not left leased', async (t) => {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: 'cli-int' } }, body: { partitions: 1 } }))
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: 'cli-int-g' } },
      body: { topic: 'cli-int', delivery: 'pull', ackTimeoutMs: 120_000 },
    }),
  )
  const values = Array.from({ length: 20 }, (_, i) => `int-${i}`)
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'cli-int' } },
      body: { messages: values.map((value) => ({ value })) },
    }),
  )
  // Between the CLI and the broker, a proxy that passes the pull's answer up to its headers and a
  // few bytes of its body, and holds the rest until the CLI has had its SIGINT: the broker has
  // written the whole answer (so it takes a closed connection for nothing), the CLI has not read it.
  let held: true | null = true
  let answerBegun!: () => void
  const begun = new Promise<void>((resolve) => (answerBegun = resolve))
  const release = () => {
    for (const [toCli, chunk] of pending) toCli.write(chunk)
    held = null
  }
  const pending: [net.Socket, Buffer][] = []
  let cliClosed = false
  const proxy = net.createServer((cli) => {
    const toBroker = net.connect(Number(new URL(url).port), '127.0.0.1')
    cli.pipe(toBroker)
    cli.on('close', () => {
      cliClosed = true
      toBroker.destroy()
    })
    cli.on('error', () => {})
    toBroker.on('error', () => cli.destroy())
    let seen = Buffer.alloc(0)
    toBroker.on('data', (chunk: Buffer) => {
      if (held === null) return void cli.write(chunk)
      if (pending.length > 0) return void pending.push([cli, chunk])
      seen = Buffer.concat([seen, chunk])
      const end = seen.indexOf('\r\n\r\n')
      if (end < 0) return
      const cut = end + 4 + 10
      cli.write(seen.subarray(0, cut))
      pending.push([cli, seen.subarray(cut)])
      answerBegun()
    })
  })
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  t.teardown(() => proxy.close())
  const via = `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`
  const cli = startCli(t, ['pull', 'cli-int-g', '--max', '20', '--ack', '--json'], { url: via })
  await begun
  cli.child.kill('SIGINT')
  // Handled: the CLI says it stops (and, as it did before it read begun answers to their end, it
  // may have cut the connection).
  await waitUntil(() => cliClosed || cli.stderr().includes('stopping'), 30_000, 'the CLI to take its SIGINT')
  release()
  // It ends by itself (a single pull), after its ack.
  await waitUntil(() => cli.child.exitCode !== null || cli.child.signalCode !== null, 60_000, 'the CLI to exit')
  t.equal(await cli.stop(), 0, cli.stderr())
  const printed = cli
    .stdout()
    .trim()
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => (JSON.parse(l) as { value: string }).value)
  t.same(printed, values, 'every message leased was printed')
  const status = await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group: 'cli-int-g' } } }))
  t.same(
    status.partitions.map((p) => [p.committedOffset, p.inFlight]),
    [[20, 0]],
    'and acked: none left leased until its deadline',
  )
})

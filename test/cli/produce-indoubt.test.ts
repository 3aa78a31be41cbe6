/**
 * `hookq produce` when a call's outcome is unknown. A front on 127.0.0.1 passes the calls on to a
 * real broker and then, per call, loses the connection, never answers, or answers the broker's
 * 500 `outcome_unknown`: the broker did commit, so the CLI must say the call's lines were sent and
 * may be stored (never "nothing was committed", which makes a re-run store them twice), and how
 * to re-run safely. Answers that exclude the commit (503, a refused connection) still say nothing
 * was stored.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { createClient, unwrap } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli } from './run.ts'

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
const createTopic = (topic: string) => unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic } }, body: { partitions: 1 } }))
const stored = async (topic: string): Promise<number> =>
  (await unwrap(hookq.GET('/v1/topics/{topic}', { params: { path: { topic } } }))).partitionStats[0]!.endOffset

/**
 * What the front does with a produce call: pass the broker's answer on, pass it on and then drop
 * the connection, pass it on and never answer, answer 500 outcome_unknown after passing it on, or
 * shed it (503) without passing it on.
 */
type Behaviour = 'forward' | 'drop' | 'hang' | 'unknown' | 'shed'

/** A front to the broker; `behaviourOf(n)` says what to do with the n-th produce call (from 0). */
async function startFront(t: Test, behaviourOf: (call: number) => Behaviour): Promise<{ url: string; calls: () => number }> {
  let calls = 0
  const front = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', async () => {
      const behaviour = req.method === 'POST' ? behaviourOf(calls++) : 'forward'
      if (behaviour === 'shed') {
        res.writeHead(503, { 'content-type': 'application/problem+json', 'retry-after': '0' })
        res.end(
          JSON.stringify({
            type: 'about:blank',
            title: 'The broker is overloaded',
            status: 503,
            code: 'overloaded',
            detail: 'shed by the test front',
          }),
        )
        return
      }
      const answer = await fetch(`${url}${req.url}`, {
        method: req.method,
        headers: { 'content-type': 'application/json' },
        ...(chunks.length > 0 ? { body: Buffer.concat(chunks) } : {}),
      })
      const body = await answer.text() // the broker has answered: whatever it did is committed
      if (behaviour === 'drop') req.socket.destroy()
      else if (behaviour === 'unknown') {
        res.writeHead(500, { 'content-type': 'application/problem+json' })
        res.end(
          JSON.stringify({
            type: 'about:blank',
            title: 'The outcome of the write is unknown',
            status: 500,
            code: 'outcome_unknown',
            detail: 'the database connection broke while these messages were being committed: they may or may not be stored.',
          }),
        )
      } else if (behaviour === 'forward')
        res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' }).end(body)
      // 'hang': no answer until the teardown closes the connection.
    })
  })
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        front.closeAllConnections()
        front.close(() => resolve())
      }),
  )
  return { url: `http://127.0.0.1:${(front.address() as AddressInfo).port}`, calls: () => calls }
}

t.test('a connection lost after the commit: the arguments were sent and may be stored', async (t) => {
  await createTopic('doubt')
  const front = await startFront(t, () => 'drop')
  const run = await runCli(['produce', 'doubt', '{"n":1}', '{"n":2}'], { url: front.url })
  t.equal(run.code, 3, 'exit 3: the broker could not be reached to the end')
  t.equal(await stored('doubt'), 2, 'the broker did commit both messages')
  t.notMatch(run.stderr, /nothing was committed/, 'never "nothing was committed" for a call in doubt')
  t.match(run.stderr, /hookq: arguments 1 to 2 were sent, but whether the broker stored them is unknown/)
  t.match(
    run.stderr,
    /no idempotency key: running the same input again may store arguments 1 to 2 twice, so check what is stored first \(hookq tail doubt\)/,
  )
  t.match(run.stderr, /a run with --idempotency-prefix can always be repeated safely/)
  t.notMatch(run.stderr, /nothing after argument 2/, 'the last argument was in the call: nothing came after it')
})

t.test('stdin: committed lines, the lines in doubt, and a safe re-run with the same --idempotency-prefix', async (t) => {
  await createTopic('doubt-lines')
  // Calls of two lines: the first passes, the second is committed and its connection dropped.
  const front = await startFront(t, (call) => (call === 0 ? 'forward' : 'drop'))
  const lines = Array.from({ length: 6 }, (_, i) => JSON.stringify({ i }))
  const run = await runCli(['produce', 'doubt-lines', '--batch-size', '2', '--idempotency-prefix', 'load 1'], {
    url: front.url,
    stdin: `${lines.join('\n')}\n`,
  })
  t.equal(run.code, 3, run.stderr)
  t.equal(front.calls(), 2, 'nothing was sent after the call in doubt')
  t.equal(await stored('doubt-lines'), 4)
  t.match(
    run.stderr,
    /2 messages were committed \(lines 1 to 2\); lines 3 to 4 were sent, but whether the broker stored them is unknown; nothing after line 4 was sent/,
  )
  t.match(run.stderr, /running the same input again with --idempotency-prefix 'load 1' is safe/)

  const again = await runCli(['--json', 'produce', 'doubt-lines', '--idempotency-prefix', 'load 1'], {
    url,
    stdin: `${lines.join('\n')}\n`,
  })
  t.equal(again.code, 0, again.stderr)
  t.match(JSON.parse(again.stdout), { produced: 2, duplicates: 4 }, 'the re-run stores only what was missing')
  t.equal(await stored('doubt-lines'), 6)
})

t.test('a broker answer of 500 outcome_unknown, and a timeout after the call was sent, are in doubt too', async (t) => {
  await createTopic('doubt-answers')
  const unknown = await startFront(t, () => 'unknown')
  const run = await runCli(['produce', 'doubt-answers', '{"n":1}'], { url: unknown.url })
  t.equal(run.code, 1, 'exit 1: the broker answered an error')
  t.match(run.stderr, /outcome_unknown \(HTTP 500\)/)
  t.match(run.stderr, /argument 1 was sent, but whether the broker stored it is unknown/)
  t.notMatch(run.stderr, /nothing was committed/)
  // The front answers 500 only after the broker has answered, so the message is already committed.
  t.equal(await stored('doubt-answers'), 1, 'the message of the call answered outcome_unknown was stored')

  const silent = await startFront(t, () => 'hang')
  const late = await runCli(['--timeout', '1000', 'produce', 'doubt-answers', '{"n":2}'], { url: silent.url })
  t.equal(late.code, 3, late.stderr)
  t.match(late.stderr, /no answer within 1000 ms/)
  t.match(late.stderr, /argument 1 was sent, but whether the broker stored it is unknown/)
  // The front passed the second call on at once; on a busy machine its commit may still be on its way.
  await waitUntil(async () => (await stored('doubt-answers')) === 2, 15_000, 'both calls committed')
  t.pass('both calls were committed')
})

t.test('answers that exclude the commit still say nothing was committed', async (t) => {
  await createTopic('not-stored')
  const shed = await startFront(t, () => 'shed')
  const run = await runCli(['produce', 'not-stored', '{"n":1}'], { url: shed.url })
  t.equal(run.code, 1)
  t.match(run.stderr, /overloaded \(HTTP 503\)/)
  t.match(run.stderr, /hookq: nothing was committed/)
  t.notMatch(run.stderr, /unknown/)

  // A port nobody listens on: the connection is refused before anything is sent.
  const closed = http.createServer()
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const port = (closed.address() as AddressInfo).port
  await new Promise<void>((resolve) => closed.close(() => resolve()))
  const refused = await runCli(['produce', 'not-stored', '{"n":1}'], { url: `http://127.0.0.1:${port}` })
  t.equal(refused.code, 3)
  t.match(refused.stderr, /ECONNREFUSED/)
  t.match(refused.stderr, /hookq: nothing was committed/)
  t.equal(await stored('not-stored'), 0)
})

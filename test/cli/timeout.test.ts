/**
 * `--timeout` holds against a broker that accepts calls and never answers them, or answers the
 * headers and never the body, even while garbage collections run during the wait (a preload runs
 * one every 50 ms): the CLI gives up after the timeout with exit code 3 and says why.
 */
import t, { type Test } from 'tap'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { runCli } from './run.ts'

const preload = fileURLToPath(new URL('./gc-preload.mjs', import.meta.url))
const gcEnv = { NODE_OPTIONS: `--expose-gc --import ${preload}` }

/** A server on 127.0.0.1 that reads each request and then answers as `answer` says (or never). */
async function silentServer(
  t: Test,
  answer: (res: http.ServerResponse) => void,
): Promise<{ url: string; requests: () => number; lastRequestAt: () => number }> {
  let requests = 0
  let lastRequestAt = 0
  const server = http.createServer((req, res) => {
    requests++
    req.resume()
    req.on('end', () => {
      lastRequestAt = Date.now()
      answer(res)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests: () => requests, lastRequestAt: () => lastRequestAt }
}

// From the request's arrival to the CLI's exit, so that the child's start-up (over 30 s on a loaded
// machine) is not counted: generous beside the 1000 ms timeout, far below the 30 s default one.
const MAX_WAIT_MS = 20_000

t.test('a broker that never answers: --timeout 1000 ends the CLI with exit 3 despite GCs', async (t) => {
  const front = await silentServer(t, () => {})
  for (const args of [
    ['topics', 'list'],
    ['produce', 'never', '{"n":1}'],
  ]) {
    const run = await runCli(['--timeout', '1000', ...args], { url: front.url, env: gcEnv })
    const tookMs = Date.now() - front.lastRequestAt()
    t.equal(run.code, 3, `${args[0]}: exit 3 (unreachable), not a hang (stderr: ${run.stderr.trim()})`)
    t.match(run.stderr, /cannot reach the broker at http:\/\/127\.0\.0\.1:\d+: no answer within 1000 ms/)
    t.ok(tookMs < MAX_WAIT_MS, `${args[0]}: ended ${tookMs} ms after its call arrived`)
  }
  t.equal(front.requests(), 2, 'each call did reach the server')
})

t.test('a broker that sends the headers and never the body: the timeout covers the body too', async (t) => {
  const front = await silentServer(t, (res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"topics":[') // and nothing more
  })
  const run = await runCli(['--timeout', '1000', 'topics', 'list'], { url: front.url, env: gcEnv })
  t.equal(run.code, 3, `exit 3, not a hang (stderr: ${run.stderr.trim()})`)
  t.match(run.stderr, /no answer within 1000 ms/)
  const tookMs = Date.now() - front.lastRequestAt()
  t.ok(tookMs < MAX_WAIT_MS, `ended ${tookMs} ms after its call arrived`)
})

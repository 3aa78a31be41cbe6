/**
 * `--timeout` holds against a broker that accepts calls and never answers them, or answers the
 * headers and never the body, even while garbage collections run during the wait (a preload runs
 * one every 50 ms): the CLI gives up after the timeout with exit code 3 and says why.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { DEFAULT_TIMEOUT_MS } from '../../src/cli/context.ts'
import { runCli } from './run.ts'

const preload = fileURLToPath(new URL('./gc-preload.mjs', import.meta.url))
const gcEnv = { NODE_OPTIONS: `--expose-gc --import ${preload}` }

/**
 * A server on 127.0.0.1 that reads each request and then answers as `answer` says (or never);
 * `arrivals` are the times at which requests were read to their end.
 */
async function silentServer(t: Test, answer: (res: http.ServerResponse) => void): Promise<{ url: string; arrivals: number[] }> {
  const arrivals: number[] = []
  const server = http.createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      arrivals.push(Date.now())
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
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, arrivals }
}

// The --timeout covers the whole call, connecting and sending included: on a loaded machine a CLI
// just started (its fetch loaded on first use) took more than 1 s to get its call to the server,
// and timed out before the server had it. 5 s makes that rare; a run whose call did not arrive is
// run again (it tested the timeout, but not against a silent server), up to a limit that only ends
// a machine that never gets a call through.
const TIMEOUT_MS = 5000
const RUNS_FOR_AN_ARRIVAL = 10
// From the call's arrival to the CLI's exit, so that the child's start-up (over 30 s on a loaded
// machine) is not counted. The rule's own bound: a CLI that used its default timeout instead of
// --timeout could not end sooner than this after its call arrived.
const MAX_WAIT_MS = DEFAULT_TIMEOUT_MS - TIMEOUT_MS

/** Runs the CLI against `front` until a run's call reaches it; each run must time out (exit 3). */
async function runUntilArrived(t: Test, front: { url: string; arrivals: number[] }, args: string[]): Promise<void> {
  for (let run = 1; ; run++) {
    const before = front.arrivals.length
    const res = await runCli(['--timeout', String(TIMEOUT_MS), ...args], { url: front.url, env: gcEnv })
    const ended = Date.now()
    t.equal(res.code, 3, `${args[0]}: exit 3 (unreachable), not a hang (stderr: ${res.stderr.trim()})`)
    t.match(res.stderr, new RegExp(`cannot reach the broker at http://127\\.0\\.0\\.1:\\d+: no answer within ${TIMEOUT_MS} ms`))
    const arrived = front.arrivals.slice(before)
    if (arrived.length > 0) {
      t.equal(arrived.length, 1, `${args[0]}: one call reached the server`)
      t.ok(ended - arrived[0]! < MAX_WAIT_MS, `${args[0]}: ended ${ended - arrived[0]!} ms after its call arrived`)
      return
    }
    t.comment(`${args[0]}: run ${run} timed out before its call reached the server (a loaded machine); again`)
    if (run >= RUNS_FOR_AN_ARRIVAL) {
      t.fail(`${args[0]}: no call reached the server in ${run} runs`)
      return
    }
  }
}

t.test('a broker that never answers: --timeout ends the CLI with exit 3 despite GCs', async (t) => {
  const front = await silentServer(t, () => {})
  await runUntilArrived(t, front, ['topics', 'list'])
  await runUntilArrived(t, front, ['produce', 'never', '{"n":1}'])
})

t.test('a broker that sends the headers and never the body: the timeout covers the body too', async (t) => {
  const front = await silentServer(t, (res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"topics":[') // and nothing more
  })
  await runUntilArrived(t, front, ['topics', 'list'])
})

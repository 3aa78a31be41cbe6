/**
 * `hookq serve` is `npm start`: --port and --host reach the broker's configuration, the broker
 * answers the CLI's own commands, and SIGTERM stops it gracefully with exit code 0.
 */
import t from '../helpers/tap.ts'
import { testDatabase, needsServer } from '../helpers/db.ts'
import { START_LIMIT_MS } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'
import { runCli, startCli } from './run.ts'

t.test('serve listens where the flags say and stops on SIGTERM', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const serve = startCli(t, ['serve', '--port', '0', '--host', '127.0.0.1', '--log-level', 'info'], {
    env: { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 4)), PORT: '8080' },
  })
  // Watched, not timed: it listens, or it exits (a failed start fails at once). The limit only ends
  // a start that hangs: a loaded machine took a broker over 30 s to start (a 30 s limit failed a
  // correct run), so the one every broker process test has.
  const listening = await waitUntil(
    () =>
      /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(serve.stdout())?.[1] ??
      (serve.child.exitCode !== null || serve.child.signalCode !== null
        ? { exited: serve.child.exitCode ?? serve.child.signalCode }
        : undefined),
    START_LIMIT_MS,
    'the broker listening',
  )
  if (typeof listening !== 'string')
    throw new Error(`serve exited (${listening.exited}) before listening:\n${serve.stdout()}${serve.stderr()}`)
  const url = listening
  t.not(url, 'http://127.0.0.1:8080', '--port overrides PORT')

  const created = await runCli(['topics', 'create', 'served', '-p', '2'], { url })
  t.equal(created.code, 0, created.stderr)
  t.equal((await fetch(`${url}/readyz`)).status, 200)

  t.equal(await serve.stop('SIGTERM'), 0, 'a graceful stop exits 0')
  t.match(serve.stdout(), /"msg":"stopped"/)
})

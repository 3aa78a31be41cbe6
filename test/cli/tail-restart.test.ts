/**
 * `hookq tail -f` outlives a broker restart: the broker process is stopped (SIGTERM) and started
 * again on the same port, and the follow says so on stderr, waits, and goes on from where it was,
 * printing what was produced while it was away exactly once.
 */
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { callBroker, spawnBroker } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'
import { startCli } from './run.ts'

t.test('tail --follow across a broker restart', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const env = { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4' }
  const first = await spawnBroker(env)
  t.teardown(() => {
    first.child.kill('SIGKILL')
  })
  const port = new URL(first.url).port
  t.equal((await callBroker(first.url, 'PUT', '/v1/topics/feed', { partitions: 2 })).status, 201)

  const follow = startCli(t, ['tail', 'feed', '--follow', '--from', 'beginning', '--max-poll-ms', '200'], { url: first.url })
  t.equal((await callBroker(first.url, 'POST', '/v1/topics/feed/messages', { messages: [{ value: 'before', partition: 0 }] })).status, 201)
  await follow.waitForOutput('"before"')

  first.child.kill('SIGTERM')
  await first.exited
  await waitUntil(() => follow.stderr().includes('still following'), 15_000, 'the follow noting the lost broker')
  t.equal(follow.child.exitCode, null, 'the follow is still running while the broker is down')

  const second = await spawnBroker({ ...env, PORT: port })
  t.teardown(() => {
    second.child.kill('SIGKILL')
  })
  t.equal((await callBroker(second.url, 'POST', '/v1/topics/feed/messages', { messages: [{ value: 'after', partition: 1 }] })).status, 201)
  await follow.waitForOutput('"after"', 20_000)
  await waitUntil(() => follow.stderr().includes('answers again'), 5000, 'the follow noting the broker is back')

  const printed = follow
    .stdout()
    .trim()
    .split('\n')
    .map((l) => l.split(' ')[0])
  t.same(printed, ['0:0', '1:0'], 'each message once, none skipped')
  t.match(follow.stderr(), /cannot reach the broker at http:\/\/127\.0\.0\.1:\d+/)
  t.equal(await follow.stop('SIGINT'), 0, 'Ctrl-C still ends it with 0')
  second.child.kill('SIGTERM')
  await second.exited
})

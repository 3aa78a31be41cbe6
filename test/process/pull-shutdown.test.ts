/**
 * SIGTERM answers the pulls waiting on a broker process at once (Dispatcher.answerPulls), with
 * what they hold: the shutdown does not wait out their long polls. Told apart without a clock: the
 * long poll (20 s) is longer than the shutdown's grace (HOOKQ_SHUTDOWN_GRACE_MS, 10 s), past which
 * the process exits 1; waiting it out would end in exit 1, answering at once in exit 0.
 */
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('SIGTERM answers waiting pulls at once and exits 0', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const spawn = brokerSpawner(t, { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4', HOOKQ_SHUTDOWN_GRACE_MS: '10000' })
  const broker = await spawn()
  t.equal((await call(broker.url, 'PUT', '/v1/topics/st', { partitions: 2 })).status, 201)
  t.equal((await call(broker.url, 'PUT', '/v1/groups/st', { topic: 'st', delivery: 'pull' })).status, 201)
  // Two callers waiting 20 s each, as the broker's gauge of waiting pulls says.
  const waiting = [1, 2].map(() => call(broker.url, 'POST', '/v1/groups/st/pull', { waitMs: 20_000 }, {}, 60_000))
  await waitUntil(
    async () => /^hookq_pulls_waiting 2$/m.test(String((await call(broker.url, 'GET', '/metrics')).json)),
    30_000,
    'two long polls waiting',
  )
  broker.child.kill('SIGTERM')
  const answers = await Promise.all(waiting)
  t.same(
    answers.map((a) => [a.status, a.json]),
    [
      [200, { messages: [] }],
      [200, { messages: [] }],
    ],
    'answered with what they held (nothing)',
  )
  t.equal(await broker.exited, 0, 'exited 0 within the grace, not after the long polls')
})

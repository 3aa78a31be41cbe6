/**
 * An ownership poll reads every group and balances them all, so a change polls at once only when
 * partitions came or went: a consumer or a setting changed waits for the regular poll.
 */
import t from '../helpers/tap.ts'
import { needsServer } from '../helpers/db.ts'
import { startBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('a group created or deleted polls at once; consumers and settings do not', { skip: needsServer }, async (t) => {
  // No regular poll within the test: every poll counted is one a change asked for.
  const broker = await startBroker(t, { HOOKQ_CLUSTER_POLL_MS: '60000' })
  const session = broker.cluster.ownership.liveSession!
  t.ok(session, 'the broker has a member session')
  let polls = 0
  const view = session.view.bind(session)
  session.view = () => {
    polls++
    return view()
  }
  const call = async (method: string, url: string, payload?: object) =>
    (await broker.app.inject({ method: method as 'GET', url, ...(payload ? { payload } : {}) })).statusCode

  t.equal(await call('PUT', '/v1/topics/p', { partitions: 2 }), 201)
  t.equal(polls, 0, 'a topic nobody consumes yet: nothing to own, no poll')
  t.equal(await call('PUT', '/v1/groups/pg', { topic: 'p' }), 201)
  await waitUntil(() => polls >= 1, 30_000, 'the new group polled')
  await waitUntil(() => broker.cluster.ownership.partitionsOf('pg') === 2, 30_000, 'its partitions seen')
  const afterCreate = polls

  for (let i = 0; i < 5; i++) t.equal(await call('POST', '/v1/groups/pg/consumers', { url: `https://example.com/hook/${i}` }), 201)
  t.equal(await call('PUT', '/v1/groups/pg', { topic: 'p', maxInFlight: 10 }), 200)
  t.equal(polls, afterCreate, 'consumers added and a setting changed: no poll')

  t.equal(await call('DELETE', '/v1/groups/pg'), 204)
  await waitUntil(() => polls > afterCreate, 30_000, 'the deleted group polled')
})

/**
 * Pull delivery's edges on one broker process: the cap on waiting long polls (429 too_many_pulls),
 * callers waiting when their group is deleted or switched to push (answered at once, 404 / 409),
 * a push group with consumers refused the switch to pull, and a broker closing answers its waiting pulls.
 */
import t from '../helpers/tap.ts'
import { startBroker } from '../helpers/broker.ts'
import { waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t, { HOOKQ_MAX_WAITING_PULLS: '2' })
const call = async (method: string, path: string, payload?: unknown) => {
  const res = await broker.app.inject({
    method: method as 'GET',
    url: path,
    ...(payload === undefined ? {} : { payload: payload as object }),
  })
  return { status: res.statusCode, headers: res.headers, json: res.body === '' ? undefined : res.json() }
}
const produce = (topic: string, messages: unknown[]) => call('POST', `/v1/topics/${topic}/messages`, { messages })

t.test('past HOOKQ_MAX_WAITING_PULLS long polls, a pull with waitMs is 429 too_many_pulls with Retry-After', async (t) => {
  await call('PUT', '/v1/topics/capped', { partitions: 1 })
  await call('PUT', '/v1/groups/capped', { topic: 'capped', delivery: 'pull' })
  const waits = [1, 2].map(() => call('POST', '/v1/groups/capped/pull', { waitMs: 20_000, maxMessages: 1 }))
  await waitUntil(() => broker.cluster.pullWaiters('capped') === 2, 30_000, 'two long polls waiting')
  const shed = await call('POST', '/v1/groups/capped/pull', { waitMs: 20_000 })
  t.equal(shed.status, 429)
  t.match(shed.headers['content-type'], /application\/problem\+json/)
  t.equal(shed.headers['retry-after'], '1')
  t.equal((shed.json as { code: string }).code, 'too_many_pulls')
  // A pull that does not wait is not a long poll: it is served.
  t.equal((await call('POST', '/v1/groups/capped/pull', { waitMs: 0 })).status, 200)
  await produce('capped', [{ value: 'a' }, { value: 'b' }])
  const answered = await Promise.all(waits)
  t.same(
    answered.map((a) => [a.status, (a.json as { messages: unknown[] }).messages.length]),
    [
      [200, 1],
      [200, 1],
    ],
  )
  // Room again once they were answered.
  const again = call('POST', '/v1/groups/capped/pull', { waitMs: 20_000 })
  await waitUntil(() => broker.cluster.pullWaiters('capped') === 1, 30_000, 'a long poll waiting again')
  await produce('capped', [{ value: 'c' }])
  t.equal((await again).status, 200)
})

t.test('a caller waiting when its group is deleted is answered 404 at once', async (t) => {
  await call('PUT', '/v1/topics/doomed', { partitions: 2 })
  await call('PUT', '/v1/groups/doomed', { topic: 'doomed', delivery: 'pull' })
  const waiting = call('POST', '/v1/groups/doomed/pull', { waitMs: 20_000 })
  await waitUntil(() => broker.cluster.pullWaiters('doomed') === 1, 30_000, 'the caller waiting')
  t.equal((await call('DELETE', '/v1/groups/doomed')).status, 204)
  const got = await waiting
  t.equal(got.status, 404)
  t.equal((got.json as { code: string }).code, 'group_not_found')
})

t.test('a caller waiting when its group switches to push is answered 409 push_group at once', async (t) => {
  await call('PUT', '/v1/topics/switched', { partitions: 1 })
  await call('PUT', '/v1/groups/switched', { topic: 'switched', delivery: 'pull' })
  const waiting = call('POST', '/v1/groups/switched/pull', { waitMs: 20_000 })
  await waitUntil(() => broker.cluster.pullWaiters('switched') === 1, 30_000, 'the caller waiting')
  t.equal((await call('PUT', '/v1/groups/switched', { topic: 'switched', delivery: 'push' })).status, 200)
  const got = await waiting
  t.equal(got.status, 409)
  t.equal((got.json as { code: string }).code, 'push_group')
})

t.test('a push group with consumers cannot become a pull group (409 group_has_consumers) until they are removed', async (t) => {
  await call('PUT', '/v1/topics/hosted', { partitions: 1 })
  await call('PUT', '/v1/groups/hosted', { topic: 'hosted' })
  const c = await call('POST', '/v1/groups/hosted/consumers', { url: 'http://127.0.0.1:9/hook' })
  t.equal(c.status, 201)
  const refused = await call('PUT', '/v1/groups/hosted', { topic: 'hosted', delivery: 'pull' })
  t.equal(refused.status, 409)
  t.equal((refused.json as { code: string }).code, 'group_has_consumers')
  t.equal((await call('GET', '/v1/groups/hosted')).json.delivery, 'push', 'unchanged')
  t.equal((await call('DELETE', `/v1/groups/hosted/consumers/${(c.json as { id: string }).id}`)).status, 204)
  const switched = await call('PUT', '/v1/groups/hosted', { topic: 'hosted', delivery: 'pull' })
  t.equal(switched.status, 200)
  t.equal(switched.json.delivery, 'pull')
})

t.test('a broker closing answers its waiting pulls at once, with what they hold (Dispatcher.answerPulls)', async (t) => {
  const other = await startBroker(t)
  const inject = (method: string, url: string, payload?: object) =>
    other.app.inject({ method: method as 'GET', url, ...(payload ? { payload } : {}) })
  await inject('PUT', '/v1/topics/closing', { partitions: 1 })
  await inject('PUT', '/v1/groups/closing', { topic: 'closing', delivery: 'pull' })
  const waiting = inject('POST', '/v1/groups/closing/pull', { waitMs: 20_000 })
  await waitUntil(() => other.cluster.pullWaiters('closing') === 1, 30_000, 'the caller waiting')
  let answered = false
  const res = waiting.then((r) => {
    answered = true
    return r
  })
  const closed = other.close()
  // Answered while the broker closes: the close waits for open requests, so it cannot end first.
  const r = await res
  t.equal(r.statusCode, 200)
  t.same(r.json(), { messages: [] })
  await closed
  t.ok(answered)
})

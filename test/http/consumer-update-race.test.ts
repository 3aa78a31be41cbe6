/**
 * PATCH /v1/groups/{group}/consumers/{id} at the same time as another PATCH or a DELETE of the same
 * consumer (issue 32 review): the row ends as one update after the other would leave it, never a
 * mix. With HOOKQ_SECRETS_KEY, auth values are sealed for the URL they go to: an update of the url
 * computed from a row another update changed meanwhile left header values sealed for the old url
 * (pushes fail) or the old values under the new auth (the wrong credentials sent).
 */
import { randomBytes } from 'node:crypto'
import t from '../helpers/tap.ts'
import { openConsumer } from '../../src/service/consumer-auth.ts'
import { SecretBox } from '../../src/security/secrets.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { startReceiver } from '../helpers/receiver.ts'

const secretsKey = randomBytes(32)
const broker = await startBroker(t, { HOOKQ_SECRETS_KEY: secretsKey.toString('base64') })
const { call, produce, allCompleted } = api(broker)
const box = new SecretBox(secretsKey)
/** The consumer's row as the dispatcher would push with it: its url and opened auth values. */
const asPushed = async (id: string) => {
  const row = await broker.db.prisma.consumer.findFirst({ where: { id } })
  return row ? openConsumer(row, box) : null
}

t.test('two PATCHes at once (url, auth) leave both changes, the values sealed for the url they go to', async (t) => {
  t.equal((await call('PUT', '/v1/topics/racing', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/racing-g', { topic: 'racing', ackMode: 'auto' })).status, 201)
  const receiver = await startReceiver(t)
  const made = await call('POST', '/v1/groups/racing-g/consumers', {
    url: `${receiver.url}/r0`,
    auth: { type: 'headers', headers: { 'x-token': 'tok-0' } },
  })
  t.equal(made.status, 201)
  const id = made.json.id as string
  const path = `/v1/groups/racing-g/consumers/${id}`

  const rounds = 12
  for (let i = 1; i <= rounds; i++) {
    const [a, b] = await Promise.all([
      call('PATCH', path, { url: `${receiver.url}/r${i}` }),
      call('PATCH', path, { auth: { type: 'headers', headers: { 'x-token': `tok-${i}` } } }),
    ])
    t.equal(a.status, 200)
    t.equal(b.status, 200)
    const row = await asPushed(id)
    t.notOk(row?.secretsError, `round ${i}: the auth values open for the consumer's url`)
    t.equal(row?.url, `${receiver.url}/r${i}`, `round ${i}: the url of the first PATCH`)
    t.same(row?.pushAuth, { type: 'headers', headers: { 'x-token': `tok-${i}` } }, `round ${i}: the values of the second`)
  }

  // And a real push goes there with them.
  await produce('racing', [{ value: { n: 1 } }])
  const [push] = await receiver.waitFor(1)
  t.equal(push!.path, `/r${rounds}`)
  t.equal(push!.headers['x-token'], `tok-${rounds}`)
  await allCompleted('racing-g')
})

t.test('a PATCH at the same time as a DELETE: the consumer is gone, the PATCH a 200 before it or a 404', async (t) => {
  t.equal((await call('PUT', '/v1/groups/racing-d', { topic: 'racing', ackMode: 'auto' })).status, 201)
  for (let i = 0; i < 6; i++) {
    const made = await call('POST', '/v1/groups/racing-d/consumers', {
      url: `http://127.0.0.1:9/d${i}`,
      auth: { type: 'headers', headers: { 'x-token': 'old' } },
    })
    t.equal(made.status, 201)
    const path = `/v1/groups/racing-d/consumers/${made.json.id}`
    const [patched, deleted] = await Promise.all([
      call('PATCH', path, { url: `http://127.0.0.1:9/e${i}`, auth: { type: 'headers', headers: { 'x-token': 'new' } } }),
      call('DELETE', path),
    ])
    t.equal(deleted.status, 204)
    t.ok([200, 404].includes(patched.status), `PATCH answered ${patched.status}`)
    t.equal(await asPushed(made.json.id), null, 'no row is left or made again')
  }
})

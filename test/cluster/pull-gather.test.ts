/**
 * A pull gathered over two broker processes (in this test process, on one database): it never
 * leases more than maxMessages in all, an owner whose share of maxMessages rounds to 0 is asked in
 * its turn, and a long poll woken on both owners at once leases only what its caller takes (the
 * probes of the two-phase gather lease nothing), so no attempt is lost. A caller that goes away
 * after both owners leased for it loses nothing either: each owner's leases are leasable again at once.
 */
import http from 'node:http'
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

interface Pulled {
  deliveryId: string
  partition: number
  value: unknown
  attempt: number
}

t.test('pull gathered over two owners', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const urls = new Map<Broker, string>()
  const start = async (): Promise<Broker> => {
    const broker = await createBroker(
      loadConfig({
        DATABASE_URL: db.url,
        HOOKQ_DB_POOL_SIZE: String(Math.max(2, Math.min(4, Math.floor(db.maxConnections / 2)))),
        HOOKQ_CLUSTER_POLL_MS: '200',
        LOG_LEVEL: 'silent',
      }),
    )
    t.teardown(() => broker.close())
    const url = await broker.app.listen({ host: '127.0.0.1', port: 0 })
    urls.set(broker, url)
    await broker.advertise(url)
    return broker
  }
  const a = await start()
  const b = await start()
  const call = async (via: Broker, method: string, url: string, payload?: object) => {
    const res = await via.app.inject({ method: method as 'GET', url, ...(payload ? { payload } : {}) })
    return { status: res.statusCode, json: res.body === '' ? undefined : res.json() }
  }
  const pull = async (via: Broker, body: object, group = 'g'): Promise<Pulled[]> => {
    const res = await call(via, 'POST', `/v1/groups/${group}/pull`, body)
    if (res.status !== 200) throw new Error(`pull ${res.status}: ${JSON.stringify(res.json)}`)
    return res.json.messages as Pulled[]
  }
  // A group of its own for each subtest: what one leaves unacked cannot reach the other.
  for (const n of ['', '2', '3']) {
    t.equal((await call(a, 'PUT', `/v1/topics/gt${n}`, { partitions: 4 })).status, 201)
    t.equal((await call(a, 'PUT', `/v1/groups/g${n}`, { topic: `gt${n}`, delivery: 'pull', ackTimeoutMs: 120_000 })).status, 201)
  }
  const mine = (x: Broker, g: string) => [0, 1, 2, 3].filter((p) => x.cluster.ownership.ownerOf(g, p) === 'self')
  await waitUntil(
    () =>
      ['g', 'g2', 'g3'].every(
        (g) => mine(a, g).length === 2 && mine(b, g).length === 2 && [0, 1, 2, 3].every((p) => a.cluster.ownership.ownerOf(g, p) !== null),
      ),
    60_000,
    'the four partitions of each group shared two and two, as a sees them',
  )
  // A message on each of the group's partitions, each produced through its partition's owner, so
  // that both owners can lease theirs at once: one produced through the other owner reaches this
  // one's reader by NOTIFY, a little later.
  const produceThroughOwners = (topic: string, g: string, value: (p: number) => string) =>
    Promise.all(
      [a, b].map((x) =>
        call(x, 'POST', `/v1/topics/${topic}/messages`, { messages: mine(x, g).map((p) => ({ value: value(p), partition: p })) }),
      ),
    )
  const inFlightOn = async (x: Broker, g: string) => {
    const s = (await call(x, 'GET', `/v1/groups/${g}`)).json as { partitions: { partition: number; inFlight: number }[] }
    return s.partitions.filter((p) => mine(x, g).includes(p.partition)).reduce((n, p) => n + p.inFlight, 0)
  }
  const ofB = mine(b, 'g')
  const ofB3 = mine(b, 'g3')

  t.test('an owner whose share rounds to 0 is asked in its turn; never more than maxMessages', async (t) => {
    // maxMessages 1 over two owners of two partitions each: each share rounds to 0. Without waiting,
    // pulls through a must reach b's partitions too (in turn), and never take more than one.
    await call(a, 'POST', '/v1/topics/gt/messages', { messages: [0, 1, 2, 3].map((p) => ({ value: `t${p}`, partition: p })) })
    const turned: Pulled[] = []
    let most = 0
    await waitUntil(
      async () => {
        const got = await pull(a, { maxMessages: 1 })
        most = Math.max(most, got.length)
        turned.push(...got)
        return turned.length === 4
      },
      30_000,
      "all four messages through a, b's partitions included",
    )
    t.same(
      turned.map((m) => m.attempt),
      [1, 1, 1, 1],
    )
    t.ok(
      turned.some((m) => ofB.includes(m.partition)),
      "b's partitions were asked",
    )
    t.equal((await call(a, 'POST', '/v1/groups/g/acks', { deliveryIds: turned.map((m) => m.deliveryId) })).status, 200)
  })

  t.test('a long poll woken on both owners at once leases only what its caller takes', async (t) => {
    // A long poll through a for one message, waiting on both owners; then a message on each
    // owner's partitions, produced through that owner at the same time, so both have one to give
    // at once. It takes one; the others are still leasable at once (attempt 1), none leased to
    // nobody (it would come back only when its 120 s lease passed). Five rounds, acked as they go.
    for (let round = 0; round < 5; round++) {
      const waiting = pull(a, { maxMessages: 1, waitMs: 20_000 }, 'g2')
      await waitUntil(
        () => a.cluster.pullWaiters('g2') >= 1 && b.cluster.pullWaiters('g2') >= 1,
        30_000,
        'the long poll waiting on both owners',
      )
      await produceThroughOwners('gt2', 'g2', (p) => `r${round}p${p}`)
      const woke = await waiting
      t.equal(woke.length, 1, 'one message for maxMessages 1')
      const rest: Pulled[] = []
      await waitUntil(
        async () => {
          rest.push(...(await pull(a, { maxMessages: 10 }, 'g2')))
          return rest.length >= 3
        },
        30_000,
        'the three other messages leasable at once',
      )
      const all = [...woke, ...rest]
      t.same(
        all.map((m) => m.attempt),
        [1, 1, 1, 1],
        'every message leased once: no attempt lost to the gather',
      )
      t.same(
        all.map((m) => m.value).sort(),
        [0, 1, 2, 3].map((p) => `r${round}p${p}`),
      )
      t.equal((await call(a, 'POST', '/v1/groups/g2/acks', { deliveryIds: all.map((m) => m.deliveryId) })).status, 200)
    }
  })

  t.test('a caller gone after both owners leased for it: every lease leasable again at once', async (t) => {
    // One message on each partition; a caller pulls all four through a (two leased by a, two by
    // b, whose answer reaches a) and its connection closes before a answers. Not waiting out the
    // 120 s leases: b's two come back to it through the give-back, a's through its own.
    // Through the owners: a gather that found only a's two at once answered with them, never asking
    // b again (b's two never leased).
    await produceThroughOwners('gt3', 'g3', (p) => `c${p}`)
    const acks = a.services.acks
    const pullService = acks.pull.bind(acks)
    let callerSignal: AbortSignal | undefined
    acks.pull = (group, opts, signal, elsewhere) => {
      if (group === 'g3') callerSignal = signal
      return pullService(group, opts, signal, elsewhere)
    }
    const cluster = a.cluster
    const pullHere = cluster.pull.bind(cluster)
    const caller = http.request(`${urls.get(a)}/v1/groups/g3/pull`, { method: 'POST', headers: { 'content-type': 'application/json' } })
    caller.on('error', () => {})
    let left = false
    // a's own lease round: once b has leased too, the caller goes, and a's answer is made after.
    cluster.pull = async (group, opts, signal) => {
      const got = await pullHere(group, opts, signal)
      if (group === 'g3' && got.length > 0 && !left) {
        left = true
        await waitUntil(async () => (await inFlightOn(b, 'g3')) === 2, 30_000, "b's two leases")
        caller.destroy()
        await waitUntil(() => callerSignal?.aborted, 30_000, 'a to see its caller gone')
      }
      return got
    }
    t.teardown(() => {
      acks.pull = pullService
      cluster.pull = pullHere
    })
    caller.end(JSON.stringify({ maxMessages: 10, waitMs: 10_000 }))
    await waitUntil(() => left && callerSignal?.aborted, 30_000, 'the caller gone after both owners leased')
    cluster.pull = pullHere
    acks.pull = pullService
    const again: Pulled[] = []
    await waitUntil(
      async () => {
        again.push(...(await pull(a, { maxMessages: 10 }, 'g3')))
        return again.length >= 4
      },
      30_000,
      "all four leasable again, b's included",
    )
    t.same(again.map((m) => m.value).sort(), ['c0', 'c1', 'c2', 'c3'])
    // Given back before its row was written (within the attempt log's 1 s hold, the common case)
    // a lease is not counted (attempt 1); on a machine slow enough to write it first, it ended as
    // a failed attempt, leased again at once without the backoff (attempt 2). Never a lease lost.
    t.ok(
      again.every((m) => m.attempt === 1 || m.attempt === 2),
      `attempts ${again.map((m) => m.attempt)}`,
    )
    // A give-back is the gathering process's alone: one sent with a token that does not match is
    // refused, and the lease stays.
    const [mineB] = again.filter((m) => ofB3.includes(m.partition))
    const forged = await b.app.inject({
      method: 'POST',
      url: '/v1/groups/g3/nacks',
      headers: { 'hookq-forwarded': '1', 'hookq-give-back': 'x'.repeat(43) },
      payload: { deliveryIds: [mineB!.deliveryId] },
    })
    t.equal(forged.statusCode, 400, 'a forged give-back refused')
    t.same(await pull(a, { maxMessages: 10 }, 'g3'), [], 'nothing leasable after it')
    t.equal((await call(a, 'POST', '/v1/groups/g3/acks', { deliveryIds: again.map((m) => m.deliveryId) })).status, 200)
  })
})

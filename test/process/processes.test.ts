// HOOKQ_PROCESSES=2: one command, two broker processes on one port. Both take calls (one pushes,
// the other forwards acks to it over its own loopback port), a process that dies is started again
// while the other keeps serving, and SIGTERM stops them all with exit 0, even one still starting.
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { childrenOf, killTree, launchBroker, spawnBroker, START_LIMIT_MS, callBroker as call } from '../helpers/process.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('two broker processes from one command', { skip: needsServer }, async (t) => {
  const env = { DATABASE_URL: (await testDatabase(t)).url, HOOKQ_PROCESSES: '2', HOOKQ_CLUSTER_POLL_MS: '200' }
  const broker = await spawnBroker(env)
  t.teardown(() => {
    killTree(broker.child.pid!)
  })
  /** Waits as waitUntil does; on a timeout, shows what the processes logged. */
  const waitFor = (ok: () => boolean | Promise<boolean>, ms: number, what: string) =>
    waitUntil(ok, ms, what).catch((err: unknown) => {
      t.comment(broker.output())
      throw err
    })
  /** True once process `pid` has logged that it listens (logs are one JSON line each, with its pid). */
  const listens = (pid: number) =>
    broker
      .output()
      .split('\n')
      .some((l) => l.includes(`"pid":${pid},`) && l.includes('Server listening'))
  await waitFor(() => childrenOf(broker.child.pid!).length === 2, START_LIMIT_MS, 'two broker processes')

  await waitFor(() => childrenOf(broker.child.pid!).every(listens), START_LIMIT_MS, 'both processes listen')
  /** hookq_partitions_owned of whichever process answers a fresh connection. */
  const ownedGauge = async () =>
    /^hookq_partitions_owned (\d+)/m.exec(String((await call(broker.url, 'GET', '/metrics', undefined, { connection: 'close' })).json))?.[1]
  /** Both processes own one of the group's two partitions: every answer, from either, says 1. */
  const oneEach = async () => {
    for (let i = 0; i < 10; i++) if ((await ownedGauge()) !== '1') return false
    return true
  }

  const acked: string[] = []
  const receiver = await startReceiver(t, (req) => {
    const id = (req.json as { deliveryId: string }).deliveryId
    // Acked through the shared port: about half of them reach the process that does not push.
    void call(broker.url, 'POST', '/v1/groups/g/acks', { deliveryIds: [id] }, { connection: 'close' }).then(
      (r) => {
        if (r.status === 200 && r.json.results[0].status === 'acked') acked.push(id)
      },
      () => {},
    )
    return { status: 200 }
  })
  t.equal((await call(broker.url, 'PUT', '/v1/topics/p', { partitions: 2 })).status, 201)
  t.equal((await call(broker.url, 'PUT', '/v1/groups/g', { topic: 'p' })).status, 201)
  t.equal((await call(broker.url, 'POST', '/v1/groups/g/consumers', { url: receiver.url })).status, 201)
  await waitFor(oneEach, 30_000, 'each process owns one partition')
  const lagZero = async () =>
    (await call(broker.url, 'GET', '/v1/groups/g')).json.partitions?.every(
      (p: { lag: number; inFlight: number }) => p.lag === 0 && p.inFlight === 0,
    )

  for (let i = 0; i < 10; i++) {
    t.equal(
      (await call(broker.url, 'POST', '/v1/topics/p/messages', { messages: Array.from({ length: 5 }, (_, j) => ({ value: i * 5 + j })) }))
        .status,
      201,
    )
  }
  await waitFor(lagZero, 30_000, 'every message pushed and acked through either process')
  t.ok(acked.length >= 50, `${acked.length} acks answered acked`)

  // One process dies: the primary starts another; the port keeps answering meanwhile.
  const before = childrenOf(broker.child.pid!)
  const [victim] = before
  process.kill(victim!, 'SIGKILL')
  await waitFor(
    () => {
      const c = childrenOf(broker.child.pid!)
      return c.length === 2 && !c.includes(victim!)
    },
    30_000,
    'a new process in its place',
  )
  const fresh = childrenOf(broker.child.pid!).find((pid) => !before.includes(pid))!
  await waitFor(() => listens(fresh), START_LIMIT_MS, 'the new process listens')
  await waitFor(oneEach, 30_000, 'the new process took its partition back from the survivor')
  t.equal(
    (await call(broker.url, 'POST', '/v1/topics/p/messages', { messages: Array.from({ length: 10 }, (_, j) => ({ value: 100 + j })) }))
      .status,
    201,
  )
  await waitFor(lagZero, 30_000, 'messages produced after the restart pushed and acked too')
  t.match(broker.output(), /a broker process exited; starting another/)

  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0, 'SIGTERM: every process stopped cleanly')
  t.same(childrenOf(broker.child.pid!), [], 'no broker process left')
})

t.test('a broker process stopped while it starts exits 0', { skip: needsServer }, async (t) => {
  // The primary passes SIGTERM to every process, one it has just started again included: that one
  // must end cleanly, not die to the signal (which the primary reports as a failed stop, exit 1).
  const b = await launchBroker({ DATABASE_URL: (await testDatabase(t, { empty: true })).url })
  t.teardown(() => {
    if (b.child.exitCode === null) b.child.kill('SIGKILL')
  })
  // Migrations log from inside start-up, before the process listens.
  await waitUntil(() => /applied migration|schema-engine/.test(b.output()), START_LIMIT_MS, 'start-up under way')
  b.child.kill('SIGTERM')
  t.equal(await b.exited, 0, 'exit 0')
  t.match(b.output(), /"msg":"stopped"/, 'it says it stopped')
})

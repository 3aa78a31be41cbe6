/**
 * The push lease (src/cluster/ownership.ts): held while the member session's last answered query is
 * recent, lapsed when it is not (a process stopped or starved), and then pushes wait: for the next
 * poll answered (the session proven, they go) or for the session lost (the partitions dropped first,
 * they go nowhere). Either clock lapses it: the monotonic one stops while the machine sleeps. test/process/move-stall.test.ts stops a real process; this one steps the proof back.
 */
import t from 'tap'
import { Ownership } from '../../src/cluster/ownership.ts'
import { openDatabase } from '../../src/store/db.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('pushes wait while the lease has lapsed: for the next poll, or for the session lost', { skip: needsServer }, async (t) => {
  const database = await testDatabase(t)
  const url = new URL(database.url)
  const proxy = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => proxy.close())
  const viaProxy = new URL(database.url)
  viaProxy.host = `127.0.0.1:${proxy.port}`
  const db = openDatabase(database.url, 2)
  t.teardown(() => db.close())

  const events: string[] = []
  const dispatcher = {
    hasGroup: () => false,
    reload: async () => {},
    acquire: async () => false,
    release: async () => {},
    owns: () => false,
    heldEpochs: () => [],
    releaseAll: () => {
      events.push('dropped')
    },
    reconcile: async () => {},
  }
  const ownership = new Ownership({
    connectionString: viaProxy.href,
    db,
    pollMs: 100,
    dispatcher,
    onNotify: () => {},
    log: { info: () => {}, warn: () => {}, error: () => {} },
  })
  t.teardown(() => ownership.stop())
  await ownership.start(null)
  t.ok(ownership.lease.held(), 'held once joined')

  // As if the process had been stopped for 10 s since its last proof.
  const session = ownership.liveSession!
  session.provenAtMs = performance.now() - 10_000
  t.notOk(ownership.lease.held(), 'lapsed')
  ownership.lease.wait(() => events.push(`push (held: ${ownership.lease.held()})`))
  t.same(events, [], 'the push waits')
  await waitUntil(() => events.length > 0, 30_000, 'the next poll proves the session')
  t.same(events, ['push (held: true)'], 'it goes once a poll is answered, on the same session')
  t.equal(ownership.liveSession, session, 'nothing was dropped')

  // As if the machine had been suspended for 10 s: the monotonic clock stood still, the wall clock
  // (and the server's idle timer) did not.
  events.length = 0
  session.provenAtWallMs = Date.now() - 10_000
  t.ok(performance.now() - session.provenAtMs < 10_000, 'the monotonic clock says recent')
  t.notOk(ownership.lease.held(), 'lapsed by the wall clock')
  ownership.lease.wait(() => events.push(`push (held: ${ownership.lease.held()})`))
  await waitUntil(() => events.length > 0, 20_000, 'the next poll proves the session again')
  t.same(events, ['push (held: true)'], 'it goes once a poll is answered')

  // Lapsed again, and the session stops answering: the partitions are dropped, then the push is let go.
  events.length = 0
  proxy.silence()
  session.provenAtMs = performance.now() - 10_000
  ownership.lease.wait(() => events.push(`push (held: ${ownership.lease.held()})`))
  await waitUntil(() => events.length >= 2, 30_000, 'the poll fails')
  t.same(events, ['dropped', 'push (held: false)'], 'dropped first, then the push goes nowhere')
})

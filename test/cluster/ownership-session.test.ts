/**
 * A member's session (src/cluster/ownership.ts), against a stand-in dispatcher, on a connection
 * through a TCP proxy that can go silent (a cut that no reset announces):
 * - the push lease: held while the session's last answered query is recent, lapsed when it is not
 *   (a process stopped or starved), and then pushes wait: for the next poll answered (the session
 *   proven, they go) or for the session lost (the partitions dropped first, they go nowhere).
 *   Either clock lapses it: the monotonic one stops while the machine sleeps.
 *   test/process/move-stall.test.ts stops a real process; this one steps the proof back.
 * - the polls (the session's heartbeat) go on while a reconciliation hangs. A silent cut hangs the
 *   pool's queries for as long as TCP takes to give up, and a reconciliation is pool queries: if the
 *   member waited for it before its next poll, nothing would notice the cut, and the process would
 *   go on pushing its partitions after the server had ended its session and another process had
 *   taken them. Found by CI (once in a while) in the leader's day.
 * (One file, one process: the two shared everything but the test's body.)
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { Ownership } from '../../src/cluster/ownership.ts'
import { openDatabase } from '../../src/store/db.ts'
import { needsServer, testDatabase, type TeardownHost, type TestDatabase } from '../helpers/db.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

type Dispatcher = ConstructorParameters<typeof Ownership>[0]['dispatcher']

/**
 * A member on a fresh database whose session goes through a proxy (`silence()` cuts it without a
 * reset), polling every 100 ms, with `dispatcher` over a stand-in that owns nothing.
 */
async function member(
  t: TeardownHost,
  dispatcher: Partial<Dispatcher>,
  opts: { reconcileEveryMs?: number } = {},
): Promise<{ database: TestDatabase; ownership: Ownership; silence(): void }> {
  const database = await testDatabase(t)
  const url = new URL(database.url)
  const proxy = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => proxy.close())
  const viaProxy = new URL(database.url)
  viaProxy.host = `127.0.0.1:${proxy.port}`
  const db = openDatabase(database.url, 2)
  t.teardown(() => db.close())
  const ownership = new Ownership({
    connectionString: viaProxy.href,
    db,
    pollMs: 100,
    ...opts,
    dispatcher: {
      hasGroup: () => false,
      reload: async () => {},
      acquire: async () => false,
      release: async () => {},
      owns: () => false,
      heldEpochs: () => [],
      releaseAll: () => {},
      reconcile: async () => {},
      ...dispatcher,
    },
    onNotify: () => {},
    log: { info: () => {}, warn: () => {}, error: () => {} },
  })
  t.teardown(() => ownership.stop())
  await ownership.start(null)
  return { database, ownership, silence: () => proxy.silence() }
}

t.test('pushes wait while the lease has lapsed: for the next poll, or for the session lost', { skip: needsServer }, async (t) => {
  const events: string[] = []
  const { ownership, silence } = await member(t, {
    releaseAll: () => {
      events.push('dropped')
    },
  })
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
  silence()
  session.provenAtMs = performance.now() - 10_000
  ownership.lease.wait(() => events.push(`push (held: ${ownership.lease.held()})`))
  await waitUntil(() => events.length >= 2, 30_000, 'the poll fails')
  t.same(events, ['dropped', 'push (held: false)'], 'dropped first, then the push goes nowhere')
})

t.test('a hung reconciliation does not stop the polls that notice a silent cut', { skip: needsServer }, async (t) => {
  // A stand-in dispatcher whose reconciliation never ends, as one on a cut pool.
  let reconciles = 0
  let dropped = 0
  const { database, ownership, silence } = await member(
    t,
    {
      releaseAll: () => {
        dropped++
      },
      reconcile: () => {
        reconciles++
        return new Promise<void>(() => {})
      },
    },
    { reconcileEveryMs: 100 },
  )
  t.ok(ownership.liveSession, 'it joined')
  const pid = ownership.liveSession!.pid
  const c = new pg.Client({ connectionString: database.url })
  await c.connect()
  t.teardown(() => c.end())
  const live = async () =>
    (await c.query(`SELECT count(*)::int AS n FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND mode = 'ShareLock'`, [pid]))
      .rows[0].n === 1
  t.ok(await live(), "the session holds the members' lock")
  await waitUntil(() => reconciles > 0, 30_000, 'a reconciliation started (and hangs)')

  silence()
  // The poll times out after max(2 s, 4 polls); it gives up then, long before TCP would.
  await waitUntil(() => dropped > 0, 30_000, 'it drops its partitions')
  t.pass('it stopped pushing when its poll went unanswered')
  t.equal(reconciles, 1, 'one reconciliation at a time')
  t.equal(ownership.liveSession, undefined, 'it has no session')
  // The server ends the silent session (idle_session_timeout), so another process can take over.
  await waitUntil(async () => !(await live()), 30_000, 'the server ended the silent session')
  t.pass('its locks are free for the others')
})

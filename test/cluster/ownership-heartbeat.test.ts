/**
 * A member's polls (its session's heartbeat) go on while a reconciliation hangs. A silent cut (no
 * reset, nothing answered) hangs the pool's queries for as long as TCP takes to give up, and a
 * reconciliation is pool queries: if the member waited for it before its next poll, nothing would
 * notice the cut, and the process would go on pushing its partitions after the server had ended its
 * session and another process had taken them. Found by CI (once in a while) in the leader's day.
 */
import t from 'tap'
import pg from 'pg'
import { Ownership } from '../../src/cluster/ownership.ts'
import { openDatabase } from '../../src/store/db.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('a hung reconciliation does not stop the polls that notice a silent cut', { skip: needsServer }, async (t) => {
  const database = await testDatabase(t)
  const url = new URL(database.url)
  const proxy = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => proxy.close())
  const viaProxy = new URL(database.url)
  viaProxy.host = `127.0.0.1:${proxy.port}`
  const db = openDatabase(database.url, 2)
  t.teardown(() => db.close())

  // A stand-in dispatcher whose reconciliation never ends, as one on a cut pool.
  let reconciles = 0
  let dropped = 0
  const dispatcher = {
    hasGroup: () => false,
    reload: async () => {},
    acquire: async () => false,
    release: async () => {},
    owns: () => false,
    heldEpochs: () => [],
    releaseAll: () => {
      dropped++
    },
    reconcile: () => {
      reconciles++
      return new Promise<void>(() => {})
    },
  }
  const ownership = new Ownership({
    connectionString: viaProxy.href,
    db,
    pollMs: 100,
    reconcileEveryMs: 100,
    dispatcher,
    onNotify: () => {},
    log: { info: () => {}, warn: () => {}, error: () => {} },
  })
  t.teardown(() => ownership.stop())
  await ownership.start(null)
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

  proxy.silence()
  // The poll times out after max(2 s, 4 polls); it gives up then, long before TCP would.
  await waitUntil(() => dropped > 0, 30_000, 'it drops its partitions')
  t.pass('it stopped pushing when its poll went unanswered')
  t.equal(reconciles, 1, 'one reconciliation at a time')
  t.equal(ownership.liveSession, undefined, 'it has no session')
  // The server ends the silent session (idle_session_timeout), so another process can take over.
  await waitUntil(async () => !(await live()), 30_000, 'the server ended the silent session')
  t.pass('its locks are free for the others')
})

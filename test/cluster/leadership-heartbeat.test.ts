/**
 * The leader's heartbeat goes on while a reconciliation hangs. A silent cut (no reset, nothing
 * answered) hangs the pool's queries for as long as TCP takes to give up, and a reconciliation is
 * pool queries: if the leader waited for it before its next heartbeat, nothing would notice the cut,
 * and the process would go on believing it leads after the server had ended its session and another
 * process had taken the lock. Found by CI (test/process/leadership-faults.test.ts, once in a while).
 */
import t from 'tap'
import pg from 'pg'
import { Leadership } from '../../src/cluster/leadership.ts'
import type { Dispatcher } from '../../src/dispatch/dispatcher.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('a hung reconciliation does not stop the heartbeat that notices a silent cut', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const url = new URL(db.url)
  const proxy = await startTcpProxy(url.hostname, Number(url.port || 5432))
  t.teardown(() => proxy.close())
  const viaProxy = new URL(db.url); viaProxy.host = `127.0.0.1:${proxy.port}`
  const pool = new pg.Pool({ connectionString: db.url, max: 2 })
  t.teardown(() => pool.end())

  // A stand-in term: it starts at once and its reconciliation never ends, as one on a cut pool.
  let reconciles = 0
  let stops = 0
  const term = {
    start: async () => {},
    reconcile: () => { reconciles++; return new Promise<void>(() => {}) },
    stop: async () => { stops++ },
  } as unknown as Dispatcher
  const roles: string[] = []
  const leadership = new Leadership({
    connectionString: viaProxy.href, pool, pollMs: 100, reconcileEveryMs: 100,
    newDispatcher: () => term, groupsForTopic: async () => [],
    log: { info: () => {}, warn: () => {}, error: () => {} },
    onRole: (role) => roles.push(role),
  })
  t.teardown(() => leadership.stop())
  await leadership.start(null)
  await waitUntil(() => leadership.isLeader, 20_000, 'it leads')
  await waitUntil(() => reconciles > 0, 20_000, 'a reconciliation started (and hangs)')
  t.equal(reconciles, 1, 'one reconciliation at a time per term')

  proxy.silence()
  // The heartbeat times out after max(2 s, 4 polls); it gives up then, long before TCP would.
  await waitUntil(() => !leadership.isLeader, 20_000, 'it gives up leading')
  t.same(roles, ['leader', 'follower'], 'it says it follows')
  t.equal(stops, 1, "the term's dispatcher is stopped")
})

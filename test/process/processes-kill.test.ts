// HOOKQ_PROCESSES=2: a process that dies with connections on their way to it. A file of its own:
// it starts a broker of two processes, which takes a while on a busy machine.
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { childrenOf, killTree, spawnBroker, START_LIMIT_MS, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test(
  'a broker process killed with connections on its way: every client is answered or sees the connection end',
  { skip: needsServer },
  async (t) => {
    // A connection on its way to a process that dies must end, so that its client sees an error: with
    // node:cluster's round-robin the primary accepted every connection and kept its own copy until the
    // process it handed it to confirmed; a process killed before confirming left the client waiting for
    // ever (curl without a timeout waited 11 minutes). A stopped process cannot confirm, so its
    // connections are the ones on their way when it is killed.
    const broker = await spawnBroker({ DATABASE_URL: (await testDatabase(t)).url, HOOKQ_PROCESSES: '2' })
    t.teardown(() => {
      killTree(broker.child.pid!)
    })
    const listens = (pid: number) =>
      broker
        .output()
        .split('\n')
        .some((l) => l.includes(`"pid":${pid},`) && l.includes('Server listening'))
    await waitUntil(() => childrenOf(broker.child.pid!).length === 2, START_LIMIT_MS, 'two broker processes')
    await waitUntil(() => childrenOf(broker.child.pid!).every(listens), START_LIMIT_MS, 'both processes listen')
    const [victim] = childrenOf(broker.child.pid!)
    process.kill(victim!, 'SIGSTOP')

    const CALLS = 8
    const outcomes: string[] = []
    // Each call on a connection of its own; a call neither answered nor ended within 30 s hangs.
    const calls = Array.from({ length: CALLS }, () =>
      call(broker.url, 'GET', '/healthz', undefined, { connection: 'close' }, 30_000).then(
        (r) => outcomes.push(`answered ${r.status}`),
        (err: Error) => outcomes.push(err.name === 'TimeoutError' ? 'hung' : 'connection ended'),
      ),
    )
    // The process that runs answers its share; at most one connection can wait for the stopped one.
    await waitUntil(() => outcomes.length >= CALLS - 1, 60_000, 'the running process answers')
    process.kill(victim!, 'SIGKILL')
    await Promise.all(calls)
    t.notOk(outcomes.includes('hung'), `every call answered or ended: ${outcomes.join(', ')}`)
    t.ok(outcomes.filter((o) => o === 'answered 200').length >= CALLS - 1, 'the running process answered the others')
  },
)

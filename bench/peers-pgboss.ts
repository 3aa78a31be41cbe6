/**
 * The pg-boss push worker of bench/peers.ts: pg-boss on the bench's database, one queue, and a
 * work() handler that POSTs each job's data to the sink (bench/lib/push.ts) and settles each job
 * on its own answer: completed on a 2xx, failed (so retried by pg-boss) otherwise.
 *
 * Settings (pg-boss 12's docs, docs/api/workers.md and queues.md):
 *   batchSize `concurrency` (100), localConcurrency 1: up to `concurrency` jobs in flight, fetched in one query,
 *       POSTed at once, settled in one statement, then the next batch. Each loop's fetch query is the expensive
 *       part, so one loop of full fetches beat 2 × 50 and 4 × 25 here (docs/performance.md)
 *   perJobResults: each job of a batch completed or failed by its own push (without it, one failed POST would fail
 *       the whole batch and redeliver the delivered ones)
 *   burstWhenBatchFull: a loop whose fetch came back full fetches again at once rather than after its polling interval
 *   useListenNotify + queue notify: new jobs wake an idle worker at once (the docs' low-latency dispatch) instead of
 *       after pollingIntervalSeconds (2 s by default, 0.5 s at the least)
 *   everything else at its default (pool of 10, maintenance and monitoring on), as a user would run it.
 *
 * Driven over IPC (bench/lib/ipc.ts): `ready` once pg-boss is started (schema installed), the queue
 * created and the workers registered; `stats` answers the pushes made. SIGTERM stops pg-boss gracefully.
 *
 * argv[2]: JSON { databaseUrl, sinkUrl, queue, concurrency }
 */
import { PgBoss } from 'pg-boss'
import { serveIpc } from './lib/ipc.ts'
import { makePusher } from './lib/push.ts'

const args = JSON.parse(process.argv[2] ?? '{}') as {
  databaseUrl: string
  sinkUrl: string
  queue: string
  concurrency: number
}

const pusher = makePusher(args.sinkUrl, args.concurrency)
const boss = new PgBoss({ connectionString: args.databaseUrl, useListenNotify: true })
boss.on('error', (err: unknown) => console.error('pg-boss (worker):', err))
await boss.start()
await boss.createQueue(args.queue, { notify: true })
await boss.work<object>(
  args.queue,
  {
    batchSize: args.concurrency,
    localConcurrency: 1,
    perJobResults: true,
    burstWhenBatchFull: true,
  },
  (jobs) =>
    Promise.all(
      jobs.map(async (job) => ({
        id: job.id,
        status: (await pusher.post(JSON.stringify(job.data))) ? ('completed' as const) : ('failed' as const),
      })),
    ),
)

serveIpc({ stats: () => ({ ...pusher.counts }) }, { pid: process.pid })

process.on('SIGTERM', () => {
  void boss
    .stop({ graceful: true, timeout: 5_000 })
    .then(() => pusher.close())
    .finally(() => process.exit(0))
})

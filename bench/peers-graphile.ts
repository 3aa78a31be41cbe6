/**
 * The graphile-worker push worker of bench/peers.ts: graphile-worker's runner on the bench's
 * database with one task, `push`, that POSTs the job's payload to the sink (bench/lib/push.ts) and
 * throws unless the sink answered 2xx, so that graphile-worker completes the job only after the
 * sink has it (and retries it otherwise).
 *
 * Settings, from graphile-worker's performance page (worker.graphile.org/docs/performance, the
 * configuration its throughput figures were measured with), with concurrentJobs set to the bench's
 * concurrency (100) instead of its 24:
 *   concurrentJobs        `concurrency`: that many tasks (so POSTs) in flight at once, like hookq's maxInFlight
 *   localQueue.size       500: the pool fetches and locks jobs in batches, not one query per job per task
 *   completeJobBatchDelay 0, failJobBatchDelay 0: completions (and failures) of one tick go to the database together
 *   maxPoolSize           10 (the default): with the local queue and batched completions a few connections serve all
 *                         100 tasks (the tasks themselves use none). graphile-worker warns that it is below concurrentJobs,
 *                         but pools of 10, 25 and 100 measured alike here (20,000 messages, two runs each: 4,800-6,000
 *                         msg/s and 91-113 us of PostgreSQL CPU per message for each), and the docs' "concurrentJobs + 2"
 *                         would exceed the server's max_connections of 100
 * Its logger drops info and debug (one line per completed job otherwise), as the bench starts hookq with LOG_LEVEL=warn.
 *
 * Driven over IPC (bench/lib/ipc.ts): `ready` once the runner is started (schema migrated);
 * `stats` answers the pushes made. SIGTERM stops the runner gracefully.
 *
 * argv[2]: JSON { databaseUrl, sinkUrl, task, concurrency }
 */
import { Logger, run } from 'graphile-worker'
import { serveIpc } from './lib/ipc.ts'
import { makePusher } from './lib/push.ts'

const args = JSON.parse(process.argv[2] ?? '{}') as { databaseUrl: string; sinkUrl: string; task: string; concurrency: number }

const pusher = makePusher(args.sinkUrl, args.concurrency)
const quiet = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(`graphile-worker ${level}: ${message}`)
})

const runner = await run({
  logger: quiet,
  noHandleSignals: true,
  taskList: {
    [args.task]: async (payload) => {
      if (!(await pusher.post(JSON.stringify(payload)))) throw new Error('the sink did not answer 2xx')
    },
  },
  preset: {
    worker: {
      connectionString: args.databaseUrl,
      concurrentJobs: args.concurrency,
      maxPoolSize: 10,
      localQueue: { size: 500 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  },
})

serveIpc({ stats: () => ({ ...pusher.counts }) }, { pid: process.pid })

process.on('SIGTERM', () => {
  void runner
    .stop()
    .then(() => pusher.close())
    .finally(() => process.exit(0))
})

/**
 * What objects with nothing to do cost (`npm run bench:idle`): one broker on a fresh database,
 * BENCH_IDLE_GROUPS topics, each with one group and one consumer (a loopback URL nothing is sent
 * to: no message is produced), then:
 *   - groups created per second (topic, group and consumer calls, 4 at once);
 *   - the idle broker's and PostgreSQL's CPU over BENCH_IDLE_SECONDS, in % of a core, from /proc;
 *   - the time of a few GET /metrics scrapes and the lag series they carry.
 * BENCH_IDLE_GROUPS=0 measures the empty broker alone, the baseline the others compare with.
 * BENCH_PROFILE_DIR=<dir> writes <dir>/idle.cpuprofile, the broker's CPU profile over the idle window
 * (through its inspector; see bench/profile-top.ts); BENCH_ROOT=<dir> runs
 * the broker of another checkout (an older commit, for a before-and-after in one sitting).
 *
 * Environment (all optional): BENCH_IDLE_GROUPS=2000  BENCH_IDLE_SECONDS=30  BENCH_DATABASE_URL=...
 */
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { brokerApi, startBroker } from './lib/broker.ts'
import { createBenchDatabase } from './lib/db.ts'
import { envCount, envInt } from './lib/env.ts'
import { startProfile } from './lib/inspector.ts'
import { countPostgresDatabases, cpuSince, cpuSnapshot } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'

const GROUPS = envCount('BENCH_IDLE_GROUPS', 2000)
const SECONDS = envInt('BENCH_IDLE_SECONDS', 30)
const SERVER = process.env.BENCH_DATABASE_URL || process.env.DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'

cleanUpOnInterrupt('the broker')
await runBench(async () => {
  run.db = await createBenchDatabase(SERVER)
  // PostgreSQL's CPU: this database's backends and the shared processes, not other work on the server.
  countPostgresDatabases([run.db.name])
  const profileDir = process.env.BENCH_PROFILE_DIR
  const root = process.env.BENCH_ROOT
  const broker = (run.broker = await startBroker(run.db.url, {
    timeoutMs: 120_000,
    inspect: profileDir !== undefined,
    ...(root ? { root } : {}),
  }))
  const api = (method: string, path: string, body?: unknown) => brokerApi(broker.url, method, path, body)

  // Four creators at once, each taking the next index: bounded by GROUPS.
  let next = 0
  const started = performance.now()
  const createCpu = cpuSnapshot(broker.pid)
  const creator = async () => {
    for (let i = next++; i < GROUPS; i = next++) {
      await api('PUT', `/v1/topics/idle-${i}`, { partitions: 1 })
      await api('PUT', `/v1/groups/idle-${i}`, { topic: `idle-${i}` })
      await api('POST', `/v1/groups/idle-${i}/consumers`, { url: `http://127.0.0.1:9/idle-${i}` })
    }
  }
  await Promise.all([creator(), creator(), creator(), creator()])
  const createSeconds = (performance.now() - started) / 1000
  const created = cpuSince(createCpu, broker.pid)
  // CPU per group tells more than groups/s on a shared machine: the rate is what the others leave.
  const msPerGroup = (pct: number) => ((10 * pct * created.seconds) / GROUPS).toFixed(1)
  if (GROUPS > 0)
    console.log(
      `created ${GROUPS} topics, groups and consumers in ${createSeconds.toFixed(1)} s: ${(GROUPS / createSeconds).toFixed(1)} groups/s, ` +
        `CPU per group: broker ${msPerGroup(created.brokerPct)} ms, PostgreSQL ${msPerGroup(created.postgresPct)} ms (host ${created.hostPct.toFixed(0)}% busy)`,
    )

  await sleep(5000) // what creation set going (ownership, first reads) settles first
  const profiler = profileDir === undefined ? undefined : await startProfile(broker.inspectorUrl!)
  const start = cpuSnapshot(broker.pid)
  await sleep(SECONDS * 1000)
  const cpu = cpuSince(start, broker.pid)
  if (profiler) {
    mkdirSync(profileDir!, { recursive: true })
    await profiler.stop(join(profileDir!, 'idle.cpuprofile'))
  }
  console.log(
    `idle over ${cpu.seconds.toFixed(1)} s: broker ${cpu.brokerPct.toFixed(1)}% of a core, PostgreSQL ${cpu.postgresPct.toFixed(1)}%`,
  )

  for (let i = 0; i < 3; i++) {
    const t0 = performance.now()
    const res = await fetch(`${broker.url}/metrics`, { signal: AbortSignal.timeout(30_000) })
    const text = await res.text()
    const lagSeries = text.split('\n').filter((l) => l.startsWith('hookq_lag{')).length
    console.log(`scrape ${i + 1}: ${(performance.now() - t0).toFixed(0)} ms, ${lagSeries} hookq_lag series`)
  }
})

/**
 * Exactly one message per tick across broker processes and their deaths: three processes tick 40
 * schedules `every: 1000`; the process seen holding the tick transaction is SIGKILLed, twice. Every
 * tick of every schedule then exists exactly once, none missing, each within 5 s. Then the last
 * process stops, none runs for a few seconds, and a new one starts: `missed: "skip"` makes none of
 * the ticks of that stretch, `"once"` the latest of them.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { setTimeout as sleep } from 'node:timers/promises'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

const SCHEDULES = 40
const GRACE_MS = 3000 // src/service/schedule-ticker.ts GRACE_MS

t.test('exactly once per tick through SIGKILLs; missed skip and once', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())
  const sep = db.url.includes('?') ? '&' : '?'
  // Each process's connections carry its name (the URL's application_name wins over the pool's),
  // so the test can see which process holds the tick transaction.
  const env = (name: string) => ({ DATABASE_URL: `${db.url}${sep}application_name=${name}`, HOOKQ_DB_POOL_SIZE: '4' })
  const spawners = new Map<string, ReturnType<typeof brokerSpawner>>()
  const spawn = (name: string) => {
    if (!spawners.has(name)) spawners.set(name, brokerSpawner(t, env(name)))
    return spawners.get(name)!()
  }

  const t0 = Date.now()
  const procs = await Promise.all(['victim1', 'victim2', 'keeper'].map(async (name) => ({ name, proc: await spawn(name) })))
  const keeper = procs[2]!.proc
  t.comment(`three started in ${Date.now() - t0} ms`)
  t.equal((await call(keeper.url, 'PUT', '/v1/topics/ticks', { partitions: 2 })).status, 201)
  t.equal((await call(keeper.url, 'PUT', '/v1/topics/missed', { partitions: 1 })).status, 201)
  for (let i = 0; i < SCHEDULES; i++) {
    const res = await call(procs[i % 3]!.proc.url, 'PUT', `/v1/schedules/s${i}`, { topic: 'ticks', every: 1000, message: { value: i } })
    t.equal(res.status, 201)
  }
  for (const missed of ['skip', 'once']) {
    const res = await call(keeper.url, 'PUT', `/v1/schedules/${missed}`, {
      topic: 'missed',
      every: 1000,
      missed,
      message: { value: missed },
    })
    t.equal(res.status, 201)
  }

  // Kill the process seen holding the tick transaction (its FOR UPDATE takes RowShareLock on schedules).
  const holder = async () =>
    (
      await c.query<{ name: string }>(
        `SELECT a.application_name AS name FROM pg_locks l JOIN pg_class r ON r.oid = l.relation
         JOIN pg_stat_activity a ON a.pid = l.pid WHERE r.relname = 'schedules' AND l.mode = 'RowShareLock'`,
      )
    ).rows.map((r) => r.name)
  const kills: number[] = []
  for (const victim of ['victim1', 'victim2']) {
    const proc = procs.find((p) => p.name === victim)!.proc
    await waitUntil(async () => (await holder()).includes(victim), 60_000, `${victim} holding a tick transaction`, 1)
    proc.child.kill('SIGKILL')
    kills.push(Date.now())
    t.equal(await proc.exited, 'SIGKILL')
  }

  t.comment(`killed twice by ${Date.now() - t0} ms`)
  // Ticks go on for a while after the second kill, then the keeper stops cleanly and none runs.
  const ticksOf = async (topic: string) =>
    (
      await c.query<{ schedule: string; tick: string; produced: Date }>(
        `SELECT headers::json->>'hookq-schedule' AS schedule, headers::json->>'hookq-schedule-tick' AS tick, produced_at AS produced
         FROM messages m JOIN topics t ON t.id = m.topic_id WHERE t.name = $1`,
        [topic],
      )
    ).rows
  const settleAfter = kills.at(-1)! + 2000
  await waitUntil(
    async () => {
      const rows = await ticksOf('ticks')
      return Array.from({ length: SCHEDULES }, (_, i) => `s${i}`).every((s) =>
        rows.some((r) => r.schedule === s && Date.parse(r.tick) >= settleAfter),
      )
    },
    30_000,
    'every schedule ticking past the kills',
    100,
  )
  keeper.child.kill('SIGTERM')
  t.equal(await keeper.exited, 0)
  const stoppedAt = Date.now()

  const rows = await ticksOf('ticks')
  const late: number[] = []
  for (let i = 0; i < SCHEDULES; i++) {
    const mine = rows.filter((r) => r.schedule === `s${i}`)
    const ticks = mine.map((r) => Date.parse(r.tick)).sort((a, b) => a - b)
    t.equal(new Set(ticks).size, ticks.length, `s${i}: no tick twice`)
    const first = ticks[0]!
    const last = ticks.at(-1)!
    t.equal(ticks.length, (last - first) / 1000 + 1, `s${i}: every tick from the first to the last, none missing (${ticks.length})`)
    t.ok(last >= settleAfter, `s${i}: ticked past the kills`)
    for (const r of mine) late.push(r.produced.getTime() - Date.parse(r.tick))
  }
  late.sort((a, b) => a - b)
  t.comment(`lateness of ${late.length} ticks: p50 ${late[Math.floor(late.length / 2)]} ms, max ${late.at(-1)} ms`)
  t.ok(late.at(-1)! <= 5000, `every tick within 5 s of its time, through the kills (max ${late.at(-1)} ms)`)

  // No broker for a few seconds (an absence the test makes: the length of the stretch is the point).
  await sleep(Math.max(0, stoppedAt + 2000 - Date.now()))
  const fresh = await spawn('fresh')
  t.comment(`fresh started by ${Date.now() - t0} ms`)
  // Its schedule runner's row comes with its first heartbeat, which may follow its first /healthz:
  // read before it, the newest start was the keeper's, and the wait below was over at once.
  const startedMs = await waitUntil(
    async () => {
      const ms = Number(
        (await c.query<{ ms: number }>(`SELECT (extract(epoch FROM max(started_at)) * 1000)::float8 AS ms FROM schedule_runners`)).rows[0]!
          .ms,
      )
      return ms > stoppedAt ? ms : undefined
    },
    30_000,
    "the fresh process's schedule runner",
    50,
  )
  await waitUntil(
    async () => {
      const m = await ticksOf('missed')
      return ['skip', 'once'].every((s) => m.some((r) => r.schedule === s && Date.parse(r.tick) >= startedMs + 1000))
    },
    30_000,
    'both missed schedules ticking again',
    100,
  )
  const spans = (
    await c.query<{ start: number; end: number }>(
      `SELECT (extract(epoch FROM started_at) * 1000)::float8 AS start,
              (extract(epoch FROM coalesce(stopped_at, alive_at + interval '${GRACE_MS} milliseconds')) * 1000)::float8 AS end
       FROM schedule_runners`,
    )
  ).rows
  const covered = (ms: number) => spans.some((s) => s.start <= ms && ms <= s.end)
  const missedRows = await ticksOf('missed')
  for (const policy of ['skip', 'once']) {
    const ticks = missedRows
      .filter((r) => r.schedule === policy)
      .map((r) => Date.parse(r.tick))
      .sort((a, b) => a - b)
    t.equal(new Set(ticks).size, ticks.length, `${policy}: no tick twice`)
    const all: number[] = []
    for (let ms = ticks[0]!; ms <= ticks.at(-1)!; ms += 1000) all.push(ms)
    const gap = all.filter((ms) => !covered(ms))
    t.ok(gap.length >= 2, `${policy}: ${gap.length} ticks passed while no broker ran`)
    const expected = all.filter(covered).concat(policy === 'once' ? [gap.at(-1)!] : [])
    t.same(
      ticks,
      expected.sort((a, b) => a - b),
      policy === 'once' ? 'every tick while a broker ran, and the latest missed one once' : 'every tick while a broker ran, none missed',
    )
  }
  fresh.child.kill('SIGTERM')
  t.equal(await fresh.exited, 0)
})

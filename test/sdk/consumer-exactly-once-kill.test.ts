/**
 * Exactly-once effects across a consumer process killed mid-message (SIGKILL, so nothing of it runs
 * after the signal): real consumer processes (exactly-once-child.ts) with PgIdempotencyStore, the
 * real broker, and the consumer's own PostgreSQL database. Killed after its COMMIT but before its
 * ack, the write stays and the redelivery, taken by a second process, is acked without running the
 * handler; killed after the handler's write but before the COMMIT, the write is gone and the
 * redelivery runs the handler. Either way the effect exists exactly once.
 */
import t from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { createClient, unwrap } from '@hookq/client'
import { generateSecret } from '../../src/dispatch/signature.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { testPool } from '../helpers/pg-pool.ts'
import { waitUntil } from '../helpers/wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))
const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url })
// The embedded database takes one connection: the broker's, and none left for the consumers.
const server = { skip: needsServer }

type TT = Parameters<typeof testDatabase>[0]

interface ConsumerProcess {
  child: ChildProcess
  url: string
  output(): string
  exited: Promise<unknown>
}

/** Starts exactly-once-child.ts; resolves once it listens. Killed at teardown if still running. */
async function startConsumer(tt: TT, env: Record<string, string>): Promise<ConsumerProcess> {
  // A clean environment: no loader of tap's in NODE_OPTIONS, only what the child needs.
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/sdk/exactly-once-child.ts'], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', HOOKQ_URL: url, ...env },
  })
  let out = ''
  child.stdout!.on('data', (d) => {
    out += d
  })
  child.stderr!.on('data', (d) => {
    out += d
  })
  const exited = new Promise((resolve) => child.on('exit', resolve))
  tt.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  const listening = await waitUntil(
    () => /listening on (http:\/\/127\.0\.0\.1:\d+\/)/.exec(out)?.[1],
    30_000,
    `the consumer listening: ${out}`,
  )
  return { child, url: listening, output: () => out, exited }
}

/** Kills the process with SIGKILL and waits until it is gone. */
async function kill(p: ConsumerProcess): Promise<void> {
  p.child.kill('SIGKILL')
  await p.exited
}

/** A topic, a group (quick retries) and one consumer at `consumerUrl`; the consumer's id. */
async function setup(name: string, consumerUrl: string, secret: string): Promise<string> {
  await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: name } }, body: { partitions: 1 } }))
  await unwrap(
    hookq.PUT('/v1/groups/{group}', {
      params: { path: { group: name } },
      body: { topic: name, maxDeliveries: 50, retry: { initialDelayMs: 100, maxDelayMs: 100, multiplier: 1, jitter: 0 } },
    }),
  )
  const c = await unwrap(
    hookq.POST('/v1/groups/{group}/consumers', { params: { path: { group: name } }, body: { url: consumerUrl, secret } }),
  )
  return c.id
}

/** The group's partition: its lag and messages in flight. */
async function partition(group: string) {
  return (await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group } } }))).partitions[0]!
}

/** The consumer's database, with an effects table that is not unique on purpose: an effect that happened twice is two rows. */
async function consumerDatabase(tt: TT) {
  const db = await testDatabase(tt, { empty: true })
  const pool = testPool(tt, db.url, 2)
  await pool.query('CREATE TABLE effects (webhook_id text NOT NULL, value int NOT NULL, pid int NOT NULL)')
  return { url: db.url, rows: async (sql: string) => (await pool.query(sql)).rows }
}

/**
 * One message, consumer process `first` (paused at `pause`) takes it; once it says it reached the
 * pause it is killed, the group's consumer is pointed at a second process, and the message is
 * pushed to that one. Returns both processes and what the database held at the kill.
 */
async function killAt(tt: TT, group: string, pause: 'after-commit' | 'after-write') {
  const db = await consumerDatabase(tt)
  const secret = generateSecret()
  const env = { HOOKQ_WEBHOOK_SECRET: secret, CONSUMER_DATABASE_URL: db.url }
  const [first, second] = await Promise.all([startConsumer(tt, { ...env, PAUSE: pause }), startConsumer(tt, env)])
  const consumerId = await setup(group, first.url, secret)
  await unwrap(hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: group } }, body: { messages: [{ value: 42 }] } }))

  const said = pause === 'after-commit' ? 'committed' : 'wrote'
  const key = await waitUntil(() => new RegExp(`^${said} (\\S+)`, 'm').exec(first.output())?.[1], 30_000, `the first consumer's "${said}"`)
  const atKill = {
    effects: await db.rows('SELECT value, pid FROM effects'),
    handled: (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    lag: (await partition(group)).lag,
  }
  await kill(first)
  await unwrap(hookq.PATCH('/v1/groups/{group}/consumers/{id}', { params: { path: { group, id: consumerId } }, body: { url: second.url } }))
  await waitUntil(
    async () => {
      const p = await partition(group)
      return p.lag === 0 && p.inFlight === 0
    },
    60_000,
    `${group}: acked`,
  )
  // The attempt log is written in batches: wait for the acked attempt's row and its answer.
  const log = await waitUntil(
    async () => {
      const d = (await unwrap(hookq.GET('/v1/groups/{group}/deliveries', { params: { path: { group }, query: { limit: 100 } } })))
        .deliveries
      return d.some((x) => x.outcome === 'acked' && x.statusCode !== null) ? d.reverse() : undefined
    },
    20_000,
    `${group}: the acked attempt logged`,
  )
  return { db, first, second, key, atKill, acked: log.filter((x) => x.outcome === 'acked') }
}

t.test('killed after COMMIT, before the ack: the redelivery is acked without running the handler', server, async (t) => {
  const { db, first, second, key, atKill, acked } = await killAt(t, 'after-commit', 'after-commit')
  t.match(key, /^after-commit\/msg_\d+_0_0$/)
  t.same(atKill.effects, [{ value: 42, pid: first.child.pid }], 'at the kill: the write committed')
  t.same(atKill.handled, [key], 'and the id with it')
  t.equal(atKill.lag, 1, 'but not acked')

  t.same(
    await db.rows('SELECT value, pid FROM effects'),
    [{ value: 42, pid: first.child.pid }],
    "the effect exists exactly once: the first process's",
  )
  t.match(acked, [{ outcome: 'acked', statusCode: 200 }], 'the redelivery was acked (by the second process: the first was gone)')
  t.ok(acked[0]!.attempt >= 2, `as attempt ${acked[0]!.attempt}`)
  t.notMatch(second.output(), /^wrote /m, 'the second process acked it without running the handler')
  t.same(
    (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    [key],
  )
})

t.test("killed after the handler's write, before COMMIT: the write is gone and the redelivery runs the handler", server, async (t) => {
  const { db, first, second, key, atKill } = await killAt(t, 'after-write', 'after-write')
  t.same(atKill.effects, [], 'at the kill: the write is not visible (not committed)')
  t.same(atKill.handled, [], 'nor the id')

  t.same(
    await db.rows('SELECT value, pid FROM effects'),
    [{ value: 42, pid: second.child.pid }],
    "the effect exists exactly once: the second process's",
  )
  t.match(second.output(), new RegExp(`^wrote ${key} attempt [2-9]`, 'm'), 'the second process ran the handler for the redelivery')
  t.same(
    (await db.rows('SELECT id FROM hookq_handled')).map((r) => r.id),
    [key],
  )
  t.match(first.output(), new RegExp(`^wrote ${key} attempt 1$`, 'm'))
})

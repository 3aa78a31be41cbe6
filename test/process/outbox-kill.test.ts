/**
 * Moving the produce outbox survives SIGKILL: a broker process killed while it moves committed
 * hookq_produce() rows into the log loses none and duplicates none, and two processes then moving
 * the rest together (one mover at a time) leave dense offsets, each key's messages in the order
 * they were produced.
 */
import t from '../helpers/tap.ts'
import pg from 'pg'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

const ROWS = 20_000
const KEYS = 7
const PARTITIONS = 3

t.test('SIGKILL while moving outbox rows: every row once, with several processes', { skip: needsServer }, async (t) => {
  const db = await testDatabase(t)
  const c = new pg.Client({ connectionString: db.url })
  await c.connect()
  t.teardown(() => c.end())
  // Small moves (200 rows a transaction), so the kill lands among many of them.
  const env = {
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: '4',
    HOOKQ_CLUSTER_POLL_MS: '200',
    HOOKQ_COMMIT_MAX_MESSAGES: '200',
    HOOKQ_OUTBOX_POLL_MS: '20',
  }
  const spawn = brokerSpawner(t, env)

  const first = await spawn()
  t.equal((await call(first.url, 'PUT', '/v1/topics/moved', { partitions: PARTITIONS })).status, 201)
  first.child.kill('SIGTERM')
  await first.exited

  // One transaction of 20,000 calls, committed while no broker runs: all of it waits in the outbox.
  await c.query('BEGIN')
  await c.query(
    `SELECT hookq_produce('moved', json_build_object('i', g)::text, key => (g % ${KEYS})::text) FROM generate_series(1, ${ROWS}) g`,
  )
  await c.query('COMMIT')
  const count = async () =>
    (
      await c.query<{ moved: number; waiting: number }>(
        `SELECT (SELECT count(*) FROM messages)::int AS moved, (SELECT count(*) FROM produce_outbox)::int AS waiting`,
      )
    ).rows[0]!

  const victim = await spawn()
  const atKill = await waitUntil(
    async () => {
      const n = await count()
      return n.moved >= ROWS / 5 ? n : undefined
    },
    60_000,
    'a fifth of the rows moved',
    2,
  )
  victim.child.kill('SIGKILL')
  t.equal(await victim.exited, 'SIGKILL')
  const after = await count()
  t.ok(
    after.waiting > 0,
    `killed mid-stream: ${atKill.moved} moved when seen, ${after.moved} moved and ${after.waiting} waiting after the kill`,
  )
  t.equal(after.moved + after.waiting, ROWS, 'a killed move rolled back whole: each row is either moved or still waiting')

  await Promise.all([spawn(), spawn()])
  await waitUntil(async () => (await count()).waiting === 0, 120_000, 'the outbox to be moved by the two processes', 50)

  const { rows } = await c.query<{ partition: number; offset: number; i: number; key: string }>(
    `SELECT partition, "offset"::int AS "offset", (value::json->>'i')::int AS i, key FROM messages ORDER BY partition, "offset"`,
  )
  t.equal(rows.length, ROWS, 'every row moved')
  t.equal(new Set(rows.map((r) => r.i)).size, ROWS, 'none twice')
  for (let p = 0; p < PARTITIONS; p++) {
    const offsets = rows.filter((r) => r.partition === p).map((r) => r.offset)
    t.ok(
      offsets.every((o, i) => o === i),
      `partition ${p}: offsets 0..${offsets.length - 1} without a hole`,
    )
  }
  for (let k = 0; k < KEYS; k++) {
    const mine = rows.filter((r) => r.key === String(k))
    t.equal(new Set(mine.map((r) => r.partition)).size, 1, `key ${k}: one partition`)
    t.ok(
      mine.every((r, i) => i === 0 || r.i > mine[i - 1]!.i),
      `key ${k}: in the order produced`,
    )
  }
})

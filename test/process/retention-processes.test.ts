// Two broker processes sweeping one database every second (HOOKQ_PROCESSES=2): a topic's messages go
// into chunks of its own (none left waiting in a default partition), and messages past the
// retention are deleted once between them (each topic's maintenance under its advisory lock): the rows their logs report add up to the rows aged, and
// the topic then keeps only the rest. Messages are aged in the database, not waited for.
import pg from 'pg'
import t from '../helpers/tap.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { brokerSpawner, callBroker as call, childrenOf } from '../helpers/process.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('two processes sweeping at once file and delete each message once', { skip: needsServer }, async (t) => {
  const url = (await testDatabase(t)).url
  const spawn = brokerSpawner(t, { DATABASE_URL: url, HOOKQ_PROCESSES: '2', HOOKQ_RETENTION_INTERVAL_MS: '1000', LOG_LEVEL: 'info' })
  const broker = await spawn()
  t.teardown(() => {
    for (const pid of childrenOf(broker.child.pid!)) process.kill(pid, 'SIGKILL')
  })
  const pool = new pg.Pool({ connectionString: url, max: 2 })
  // An idle client of it is cut off when the test database is dropped in teardown (57P01, seen once):
  // the pool's 'error' then must not fail the test.
  pool.on('error', () => {})
  t.teardown(() => pool.end())
  const waitFor = (ok: () => Promise<boolean>, ms: number, what: string) =>
    waitUntil(ok, ms, what).catch((err: unknown) => {
      t.comment(broker.output())
      throw err
    })

  const listening = () =>
    new Set(
      broker
        .output()
        .split('\n')
        .filter((l) => l.includes('"msg":"Server listening'))
        .map((l) => (JSON.parse(l) as { pid: number }).pid),
    )
  await waitFor(async () => listening().size === 2, 150_000, 'both processes listen')

  t.equal((await call(broker.url, 'PUT', '/v1/topics/swept', { partitions: 2, retentionMs: 60_000 })).status, 201)
  const TOTAL = 300
  const AGED = 200
  for (let i = 0; i < TOTAL; i += 100) {
    const res = await call(broker.url, 'POST', '/v1/topics/swept/messages', {
      messages: Array.from({ length: 100 }, (_, j) => ({ value: i + j, partition: (i + j) % 2 })),
    })
    t.equal(res.status, 201)
  }
  const inDefault = async () =>
    Number(
      (
        await pool.query(
          `SELECT count(*) AS n FROM messages m JOIN topics t ON t.id = m.topic_id
           WHERE t.name = 'swept' AND m.tableoid::regclass::text LIKE '%default'`,
        )
      ).rows[0].n,
    )
  await waitFor(async () => (await inDefault()) === 0, 60_000, 'the topic filed into chunks of its own')

  // The first 100 offsets of each partition an hour back: the topic's default partition holds them,
  // and a sweep (whichever process runs it) deletes them.
  await pool.query(
    `UPDATE messages m SET produced_at = produced_at - interval '1 hour' FROM topics t WHERE t.id = m.topic_id AND t.name = 'swept' AND m."offset" < $1`,
    [AGED / 2],
  )
  const starts = async () =>
    ((await call(broker.url, 'GET', '/v1/topics/swept')).json.partitionStats as { startOffset: number; endOffset: number }[]).map(
      (p) => `${p.startOffset}-${p.endOffset}`,
    )
  await waitFor(async () => (await starts()).join() === '100-150,100-150', 60_000, 'the aged messages deleted')
  const reported = () =>
    broker
      .output()
      .split('\n')
      .filter((l) => l.includes('deleted messages past retention'))
      .reduce((n, l) => n + (JSON.parse(l) as { rows: number }).rows, 0)
  await waitFor(async () => reported() >= AGED, 10_000, 'the deletions logged')
  t.equal(reported(), AGED, 'each aged message deleted once between the two processes')
  const kept = (await call(broker.url, 'GET', '/v1/topics/swept/partitions/0/messages?fromOffset=0&limit=1000')).json.messages
  t.equal(kept.length, 50)
  t.equal(kept[0].offset, 100, 'a read from 0 starts at the oldest kept')
})

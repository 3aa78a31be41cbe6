/**
 * The produce outbox against what valid and invalid input can do to it (issue 29): a move is
 * bounded by bytes as well as rows (six 250 MiB values in one batch could not be joined, and wedged
 * the outbox for good), and a row that cannot be moved is set aside with its reason, reported by
 * its outbox id, while the rows behind it move on. The byte bound is set to a few KiB here, so
 * values of a few KiB stand in for hundreds of MiB. And nesting: hookq_produce() refuses what HTTP
 * refuses (more than 128 levels), and a deeper value already stored still reads back.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import pg from 'pg'
import { moveOutbox } from '../../src/store/outbox.ts'
import { runCli } from '../cli/run.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

const BATCH_BYTES = 8192

t.test('the produce outbox under large and unmovable rows', { skip: needsServer }, async (t: Test) => {
  const { broker, url } = await startListeningBroker(t, { HOOKQ_OUTBOX_POLL_MS: '20', HOOKQ_OUTBOX_BATCH_BYTES: String(BATCH_BYTES) })
  const pool = new pg.Pool({ connectionString: broker.databaseUrl, max: 4 })
  t.teardown(() => pool.end())
  const call = async (method: string, p: string, body?: unknown) => {
    const res = await fetch(`${url}${p}`, {
      method,
      ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    })
    const text = await res.text()
    const json = res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : undefined
    return { status: res.status, json, text }
  }
  const values = async (topic: string) =>
    (await call('GET', `/v1/topics/${topic}/partitions/0/messages?limit=1000`)).json.messages.map((m: { value: unknown }) => m.value)
  const outboxEmpty = () =>
    waitUntil(async () => (await pool.query('SELECT 1 FROM produce_outbox LIMIT 1')).rowCount === 0, 20_000, 'the outbox to be moved')
  const big = (i: number, bytes: number) => JSON.stringify({ i, pad: 'x'.repeat(bytes) })

  t.test('a move takes at most the byte bound, and a larger row alone', async (t) => {
    t.equal((await call('PUT', '/v1/topics/big', { partitions: 1 })).status, 201)
    await broker.outbox.stop() // the rows wait for the moves below
    t.teardown(() => broker.outbox.start())
    const c = await pool.connect()
    try {
      await c.query('BEGIN')
      for (let i = 0; i < 3; i++) await c.query(`SELECT hookq_produce('big', $1)`, [big(i, 3000)])
      await c.query(`SELECT hookq_produce('big', $1)`, [big(3, 3 * BATCH_BYTES)])
      await c.query(`SELECT hookq_produce('big', $1)`, [big(4, 10)])
      await c.query('COMMIT')
    } finally {
      c.release()
    }
    const place = (row: { topicId: number; key: string | null; value: string; headers: string; delayMs: number }) => ({
      ...row,
      partition: 0,
      idempotencyKey: null,
      traceId: '0af7651916cd43dd8448eb211c80319c',
      traceparent: null,
      tracestate: null,
    })
    const sizes: number[] = []
    for (let moves = 0; moves < 10; moves++) {
      const moved = await moveOutbox(broker.db, { rows: 100, bytes: BATCH_BYTES }, place)
      if (!moved || moved.rows.length === 0) break
      sizes.push(moved.rows.length)
      t.equal(moved.cut, (await pool.query('SELECT 1 FROM produce_outbox')).rowCount! > 0, 'cut says whether rows were left behind')
    }
    t.same(sizes, [2, 1, 1, 1], 'two 3 KB rows fit in 8 KiB, a third does not; the 24 KiB row moves alone')
    t.same(
      (await values('big')).map((v: { i: number }) => v.i),
      [0, 1, 2, 3, 4],
      'every row in the log, in outbox order',
    )
  })

  t.test('a row that cannot be moved is set aside and reported; the rows behind it move on', async (t) => {
    t.equal((await call('PUT', '/v1/topics/poison', { partitions: 1 })).status, 201)
    const c = await pool.connect()
    let badId: number
    try {
      // One transaction, so all three are in one batch. The middle row did not come through
      // hookq_produce (which checks JSON): it stands for any row the append refuses.
      await c.query('BEGIN')
      await c.query(`SELECT hookq_produce('poison', '"before"')`)
      const bad = await c.query<{ id: string }>(
        `INSERT INTO produce_outbox (topic_id, value) SELECT id, '{"broken": ' FROM topics WHERE name = 'poison' RETURNING id`,
      )
      badId = Number(bad.rows[0]!.id)
      await c.query(`SELECT hookq_produce('poison', '"after"')`)
      await c.query('COMMIT')
    } finally {
      c.release()
    }
    await outboxEmpty()
    t.same(await values('poison'), ['before', 'after'], 'the rows around it are in the log, in order')
    const aside = await pool.query('SELECT id, value, reason FROM produce_outbox_set_aside')
    t.same(
      aside.rows.map((r) => ({ id: Number(r.id), value: r.value })),
      [{ id: badId, value: '{"broken": ' }],
      'the row is kept whole under its outbox id',
    )
    t.match(aside.rows[0].reason, /^22P02: invalid input syntax for type json/)
    t.match((await call('GET', '/metrics')).text, /^hookq_outbox_set_aside_total 1$/m)

    // Later transactions are not held behind it.
    await pool.query(`SELECT hookq_produce('poison', '"later"')`)
    await outboxEmpty()
    t.same(await values('poison'), ['before', 'after', 'later'])
  })
  t.test('hookq_produce refuses a value nested deeper than HTTP takes; one already stored still reads', async (t) => {
    t.equal((await call('PUT', '/v1/topics/deep', { partitions: 1 })).status, 201)
    const nested = (n: number) => `${'['.repeat(n)}${']'.repeat(n)}`
    // Strings hold brackets that do not count; 128 levels pass, 129 do not, as over HTTP.
    const ok = `{"s":"[[[{{{\\"]]","v":${nested(127)},"w":[${'{"a":1},'.repeat(200)}[]]}`
    await pool.query(`SELECT hookq_produce('deep', $1)`, [ok])
    const refused = await pool.query(`SELECT hookq_produce('deep', $1)`, [`[${nested(128)}]`]).then(
      () => undefined,
      (e: { code: string; message: string }) => e,
    )
    t.equal(refused?.code, '22023')
    t.match(refused?.message, /hookq_produce: value nests more than 128 levels of arrays and objects/)
    const overHttp = await call('POST', '/v1/topics/deep/messages', { messages: [{ value: JSON.parse(`[${nested(128)}]`) }] })
    t.equal(overHttp.status, 400, 'HTTP refuses the same value')
    await outboxEmpty()

    // A value stored before the check: 8,000 levels, written into the log directly.
    await pool.query(
      `WITH p AS (UPDATE topic_partitions SET next_offset = next_offset + 1
                  WHERE topic_id = (SELECT id FROM topics WHERE name = 'deep') AND partition = 0
                  RETURNING topic_id, next_offset - 1 AS o)
       INSERT INTO messages (topic_id, partition, "offset", value, headers) SELECT topic_id, 0, o, $1, '{}' FROM p`,
      [nested(8000)],
    )
    await pool.query(`SELECT hookq_produce('deep', '"after"')`)
    await outboxEmpty()
    const read = await call('GET', '/v1/topics/deep/partitions/0/messages')
    t.equal(read.status, 200, 'the partition reads')
    t.same(
      read.json.messages.map((m: { offset: number }) => m.offset),
      [0, 1, 2],
    )
    t.equal(JSON.stringify(read.json.messages[0].value), ok, 'values come back as stored')
    t.equal(read.json.messages[2].value, 'after')
    const tail = await runCli(['tail', 'deep', '--from', '0'], { url })
    t.equal(tail.code, 0, tail.stderr)
    t.match(tail.stdout, /^0:1 \S+ key=- "\(value nested too deeply to print\)"$/m)
    t.match(tail.stdout, /^0:2 \S+ key=- "after"$/m)
  })
})

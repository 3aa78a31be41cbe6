/**
 * hookq_produce() in the caller's own transaction, against a real broker and its real database:
 * produced if and only if the transaction commits; a held-open caller blocks neither HTTP produce
 * nor other callers; offsets dense and in commit order under concurrent SQL and HTTP producers;
 * idempotency keys across both ways; bad arguments abort the caller's transaction with a clear
 * error; exact values; and the README's two examples run as files.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { spawn } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { partitionForKey } from '../../src/core/partitioner.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))
// Several connections at once (a held transaction beside others): a server, not the embedded database.
t.test("hookq_produce in the caller's own transaction", { skip: needsServer }, run)

async function run(t: Test): Promise<void> {
  // The /metrics gauges are read in the background every HOOKQ_METRICS_REFRESH_MS (5 s by default):
  // 50 ms lets the outbox gauge's test see each change at once instead of waiting out two reads.
  const { broker, url } = await startListeningBroker(t, { HOOKQ_OUTBOX_POLL_MS: '20', HOOKQ_METRICS_REFRESH_MS: '50' })
  const pool = new pg.Pool({ connectionString: broker.databaseUrl, max: 12 })
  t.teardown(() => pool.end())

  async function call(method: string, p: string, body?: unknown): Promise<{ status: number; json: any }> {
    const res = await fetch(`${url}${p}`, {
      method,
      ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, json: text ? JSON.parse(text) : undefined }
  }
  async function createTopic(name: string, partitions: number): Promise<void> {
    const r = await call('PUT', `/v1/topics/${name}`, { partitions })
    if (r.status !== 201) throw new Error(`create ${name}: ${JSON.stringify(r.json)}`)
  }
  type Stored = { partition: number; offset: number; key: string | null; value: any; headers: Record<string, string>; timestamp: string }
  async function messages(topic: string, partitions: number): Promise<Stored[]> {
    const all: Stored[] = []
    for (let p = 0; p < partitions; p++) {
      const r = await call('GET', `/v1/topics/${topic}/partitions/${p}/messages?limit=1000`)
      all.push(...r.json.messages)
    }
    return all
  }
  /** Runs `fn` in a transaction on a client of its own; commits unless told to roll back. */
  async function inTransaction<T>(fn: (c: pg.PoolClient) => Promise<T>, end: 'COMMIT' | 'ROLLBACK' = 'COMMIT'): Promise<T> {
    const c = await pool.connect()
    try {
      await c.query('BEGIN')
      const r = await fn(c)
      await c.query(end)
      return r
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {})
      throw err
    } finally {
      c.release()
    }
  }
  const outboxRows = async () => (await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM produce_outbox')).rows[0]!.n
  /** Every committed outbox row has been moved (the broker polls every 20 ms here). */
  const outboxEmpty = () => waitUntil(async () => (await outboxRows()) === 0, 20_000, 'the outbox to be moved')

  t.test('a rollback leaves nothing; a commit yields exactly one message, pushed like any other', async (t) => {
    await createTopic('tx1', 2)
    const receiver = await startReceiver(t)
    t.equal((await call('PUT', '/v1/groups/tx1-g', { topic: 'tx1', ackMode: 'auto' })).status, 201)
    t.equal((await call('POST', '/v1/groups/tx1-g/consumers', { url: receiver.url })).status, 201)

    const rolledBack = await inTransaction((c) => c.query(`SELECT hookq_produce('tx1', '{"n":1}') AS id`), 'ROLLBACK')
    t.match(rolledBack.rows[0].id, /^\d+$/, 'the function returns the outbox id (a bigint)')
    await inTransaction((c) => c.query(`SELECT hookq_produce('tx1', '{"n":2}', key => 'k', headers => '{"h":"v"}')`))
    await outboxEmpty()
    const stored = await messages('tx1', 2)
    t.same(
      stored.map((m) => ({ partition: m.partition, offset: m.offset, key: m.key, value: m.value, headers: m.headers })),
      [{ partition: partitionForKey('k', 2), offset: 0, key: 'k', value: { n: 2 }, headers: { h: 'v' } }],
      "the committed message alone, on its key's partition",
    )
    const pushed = await receiver.waitFor(1, 20_000)
    t.match(pushed[0]!.json, { topic: 'tx1', key: 'k', value: { n: 2 }, headers: { h: 'v' }, attempt: 1 })
  })

  t.test('values keep \\u0000 and key order; delay_ms holds the push back', async (t) => {
    await createTopic('tx2', 1)
    const receiver = await startReceiver(t)
    t.equal((await call('PUT', '/v1/groups/tx2-g', { topic: 'tx2', ackMode: 'auto' })).status, 201)
    t.equal((await call('POST', '/v1/groups/tx2-g/consumers', { url: receiver.url })).status, 201)
    const text = '{"z":1,"a":"nul \\u0000 here","m":[3,{"y":null,"b":true}]}'
    await inTransaction((c) => c.query('SELECT hookq_produce($1, $2)', ['tx2', text]))
    await inTransaction((c) => c.query(`SELECT hookq_produce('tx2', '"later"', delay_ms => 1500)`))
    await outboxEmpty()
    const [first, later] = await messages('tx2', 1)
    t.strictSame(first!.value, { z: 1, a: 'nul \u0000 here', m: [3, { y: null, b: true }] })
    t.same(Object.keys(first!.value), ['z', 'a', 'm'], 'key order kept')
    const [push] = await receiver.waitFor(1, 20_000)
    t.ok(push!.body.includes(`"value":${text}`), 'pushed as the caller wrote it')
    const delays = await pool.query(
      `SELECT extract(epoch from available_at - produced_at) * 1000 AS ms FROM messages m
      JOIN topics t ON t.id = m.topic_id WHERE t.name = 'tx2' AND m."offset" = $1`,
      [later!.offset],
    )
    t.equal(Number(delays.rows[0].ms), 1500, 'available 1500 ms after it was produced')
    const pushes = await receiver.waitFor(2, 20_000)
    const held = pushes.find((r) => (r.json as { value: unknown }).value === 'later')!
    const producedAt = Date.parse((held.json as { timestamp: string }).timestamp)
    t.ok(held.receivedAt >= producedAt + 1500 - 5, `pushed ${held.receivedAt - producedAt} ms after it was produced (delay 1500)`)
  })

  t.test("bad arguments raise a clear error that aborts the caller's transaction", async (t) => {
    await createTopic('tx3', 1)
    await pool.query('CREATE TABLE IF NOT EXISTS tx3_orders (id int PRIMARY KEY)')
    const cases: [string, unknown[], string, RegExp][] = [
      [`SELECT hookq_produce('nope', '1')`, [], '42704', /hookq_produce: topic "nope" does not exist/],
      [`SELECT hookq_produce('tx3', '{bad')`, [], '22P02', /invalid input syntax for type json/],
      [`SELECT hookq_produce('tx3', NULL)`, [], '22004', /value must not be NULL/],
      [`SELECT hookq_produce('tx3', '1', headers => '[1]')`, [], '22023', /headers must be a JSON object of string values/],
      [`SELECT hookq_produce('tx3', '1', headers => '{"a":1}')`, [], '22023', /headers must be a JSON object of string values/],
      [`SELECT hookq_produce('tx3', '1', headers => '{"":"x"}')`, [], '22023', /names of 1 to 256 characters/],
      [`SELECT hookq_produce('tx3', '1', delay_ms => -1)`, [], '22023', /delay_ms must be 0 or more/],
      [`SELECT hookq_produce('tx3', '1', idempotency_key => '')`, [], '22023', /idempotency_key must be 1 to 512 characters/],
      [`SELECT hookq_produce('tx3', '1', key => $1)`, ['k'.repeat(4097)], '22023', /key is 4097 characters; at most 4096/],
      // Only the broker writes hookq-dlq-* headers (replay trusts them), in any case or JSON spelling.
      [
        `SELECT hookq_produce('tx3', '1', headers => $1)`,
        ['{"hookq-dlq-topic":"payments"}'],
        '22023',
        /header "hookq-dlq-topic" is the broker's own/,
      ],
      [
        `SELECT hookq_produce('tx3', '1', headers => $1)`,
        ['{"a":"b","HookQ-DLQ-Group":"g"}'],
        '22023',
        /header "HookQ-DLQ-Group" is the broker's own/,
      ],
      [
        `SELECT hookq_produce('tx3', '1', headers => $1)`,
        ['{"\\u0068ookq-dlq-offset":"7"}'],
        '22023',
        /header "hookq-dlq-offset" is the broker's own/,
      ],
    ]
    for (const [i, [sql, params, code, message]] of cases.entries()) {
      const c = await pool.connect()
      try {
        await c.query('BEGIN')
        await c.query('INSERT INTO tx3_orders VALUES ($1)', [i])
        const err = await c.query(sql, params).then(
          () => undefined,
          (e: { code: string; message: string }) => e,
        )
        t.equal(err?.code, code, `${sql}: SQLSTATE ${code}`)
        t.match(err?.message, message)
        const after = await c.query('SELECT 1').then(
          () => 'ran',
          (e: { code: string }) => e.code,
        )
        t.equal(after, '25P02', 'the transaction is aborted: nothing more runs in it')
      } finally {
        await c.query('ROLLBACK')
        c.release()
      }
    }
    t.equal((await pool.query('SELECT count(*)::int AS n FROM tx3_orders')).rows[0].n, 0, "the callers' own writes rolled back")
    t.equal(await outboxRows(), 0)
    t.same(await messages('tx3', 1), [])
  })

  t.test('a transaction held open after the call blocks neither HTTP produce nor other callers', async (t) => {
    await createTopic('tx4', 1)
    const held = await pool.connect()
    t.teardown(() => held.release())
    await held.query('BEGIN')
    await held.query(`SELECT hookq_produce('tx4', '"held"', key => 'same')`)
    // Each of these would wait for the held transaction if the call had taken a lock they need;
    // a generous bound turns such a wait into a failure instead of a hang.
    // The bound's timer is cleared once the call settles: left running, it kept the test process
    // alive for its 15 s after the last test (tap ends a file when nothing is pending).
    const bounded = async <T>(p: Promise<T>, what: string) => {
      let timer: NodeJS.Timeout | undefined
      try {
        return await Promise.race([
          p,
          new Promise<never>((_, reject) => {
            timer = setTimeout(() => reject(new Error(`${what} waited for the open transaction`)), 15_000)
          }),
        ])
      } finally {
        clearTimeout(timer)
      }
    }
    const http = await bounded(call('POST', '/v1/topics/tx4/messages', { messages: [{ value: 'http', key: 'same' }] }), 'HTTP produce')
    t.equal(http.status, 201)
    t.same(http.json.results, [{ partition: 0, offset: 0 }])
    await bounded(
      inTransaction((c) => c.query(`SELECT hookq_produce('tx4', '"other caller"', key => 'same')`)),
      'another caller',
    )
    await bounded(
      waitUntil(async () => (await messages('tx4', 1)).length === 2, 15_000, "the other caller's message"),
      "moving the other caller's message",
    )
    await held.query('COMMIT')
    await outboxEmpty()
    t.same(
      (await messages('tx4', 1)).map((m) => [m.offset, m.value]),
      [
        [0, 'http'],
        [1, 'other caller'],
        [2, 'held'],
      ],
      'dense offsets in commit order: the held message comes after those committed before it',
    )
  })

  t.test('idempotency keys deduplicate across HTTP produce and hookq_produce', async (t) => {
    await createTopic('tx5', 2)
    const first = await call('POST', '/v1/topics/tx5/messages', { messages: [{ value: 'http first', idempotencyKey: 'a' }] })
    t.equal(first.status, 201)
    await inTransaction((c) => c.query(`SELECT hookq_produce('tx5', '"sql repeat"', idempotency_key => 'a')`))
    await inTransaction((c) => c.query(`SELECT hookq_produce('tx5', '"sql first"', idempotency_key => 'b')`))
    await inTransaction(async (c) => {
      // Twice in one transaction: one message.
      await c.query(`SELECT hookq_produce('tx5', '"sql twice"', idempotency_key => 'c')`)
      await c.query(`SELECT hookq_produce('tx5', '"sql twice again"', idempotency_key => 'c')`)
    })
    await outboxEmpty()
    const again = await call('POST', '/v1/topics/tx5/messages', { messages: [{ value: 'http repeat', idempotencyKey: 'b' }] })
    t.equal(again.status, 201)
    t.equal(again.json.results[0].duplicate, true, 'HTTP produce sees the key hookq_produce used')
    const values = (await messages('tx5', 2)).map((m) => m.value).sort()
    t.same(values, ['http first', 'sql first', 'sql twice'])
  })

  t.test("concurrent SQL and HTTP producers: dense offsets, each producer's messages in its commit order", async (t) => {
    const partitions = 3
    await createTopic('tx6', partitions)
    const sqlWriters = 8
    const perWriter = 30
    const httpWriters = 2
    const sql = Array.from({ length: sqlWriters }, async (_, w) => {
      for (let i = 0; i < perWriter; i++) {
        // 1 to 3 messages per transaction; every transaction commits before the next begins.
        const n = 1 + ((w + i) % 3)
        await inTransaction(async (c) => {
          for (let j = 0; j < n; j++)
            await c.query('SELECT hookq_produce($1, $2, key => $3)', ['tx6', JSON.stringify({ w: `s${w}`, i, j }), `s${w}`])
        })
      }
    })
    const http = Array.from({ length: httpWriters }, async (_, w) => {
      for (let i = 0; i < perWriter; i++) {
        const r = await call('POST', '/v1/topics/tx6/messages', { messages: [{ value: { w: `h${w}`, i, j: 0 }, key: `h${w}` }] })
        if (r.status !== 201) throw new Error(`HTTP produce answered ${r.status}`)
      }
    })
    await Promise.all([...sql, ...http])
    await outboxEmpty()
    const stored = await messages('tx6', partitions)
    let expected = httpWriters * perWriter
    for (let w = 0; w < sqlWriters; w++) for (let i = 0; i < perWriter; i++) expected += 1 + ((w + i) % 3)
    t.equal(stored.length, expected, 'every message once')
    for (let p = 0; p < partitions; p++) {
      const offsets = stored.filter((m) => m.partition === p).map((m) => m.offset)
      t.same(
        offsets,
        offsets.map((_, i) => i),
        `partition ${p}: offsets 0..${offsets.length - 1} without a hole`,
      )
    }
    const byWriter = new Map<string, Stored[]>()
    for (const m of stored) byWriter.set(m.value.w, [...(byWriter.get(m.value.w) ?? []), m])
    for (const [w, list] of byWriter) {
      t.equal(new Set(list.map((m) => m.partition)).size, 1, `${w}: one partition (its key's)`)
      const order = list.sort((a, b) => a.offset - b.offset).map((m) => m.value.i * 10 + m.value.j)
      t.same(
        order,
        [...order].sort((a, b) => a - b),
        `${w}: in the order its transactions committed`,
      )
    }
  })

  t.test('hookq_outbox_oldest_seconds shows a message waiting to be moved, and 0 once it is', async (t) => {
    await createTopic('tx7', 1)
    const gauge = async () => {
      const text = (await broker.app.inject({ method: 'GET', url: '/metrics' })).body
      return Number(/^hookq_outbox_oldest_seconds (\S+)$/m.exec(text)?.[1])
    }
    t.equal(await gauge(), 0, 'nothing waits')
    await broker.outbox.stop() // as if every broker were down: the row waits
    t.teardown(() => broker.outbox.start())
    await inTransaction((c) => c.query(`SELECT hookq_produce('tx7', '"waits"')`))
    await waitUntil(async () => (await gauge()) >= 1, 20_000, 'the gauge to pass one second', 100)
    t.same(await messages('tx7', 1), [], 'not moved while no mover runs')
    broker.outbox.start()
    await outboxEmpty()
    t.same(
      (await messages('tx7', 1)).map((m) => m.value),
      ['waits'],
    )
    // Served from a snapshot read in the background (src/lag-snapshot.ts): 0 by the next read.
    await waitUntil(async () => (await gauge()) === 0, 20_000, 'back to 0 once moved', 100)
  })

  t.test("the README's examples, run as files: the order and its message commit together", async (t) => {
    await createTopic('orders', 2)
    const readme = await readFile(path.join(root, 'README.md'), 'utf8')
    for (const [file, runner] of [
      ['examples/produce-in-transaction.mjs', []],
      ['examples/produce-in-transaction-prisma.ts', ['--import', 'tsx']],
    ] as const) {
      const text = await readFile(path.join(root, file), 'utf8')
      const shown = new RegExp(`<!-- ${file.replace(/[.]/g, '\\.')} -->\\n\`\`\`(?:js|ts)\\n([\\s\\S]*?)\`\`\`\\n`).exec(readme)?.[1]
      t.equal(shown, text, `the README shows ${file} exactly`)
      const child = spawn(process.execPath, [...runner, file], {
        cwd: root,
        env: { PATH: process.env.PATH ?? '', DATABASE_URL: broker.databaseUrl },
        stdio: ['ignore', 'pipe', 'pipe'],
      })
      let out = ''
      child.stdout.on('data', (d) => {
        out += d
      })
      child.stderr.on('data', (d) => {
        out += d
      })
      const code = await new Promise<number | null>((resolve) => child.on('exit', resolve))
      t.equal(code, 0, `${file} ran: ${out}`)
      const id = /order (o-\d+) stored/.exec(out)?.[1]
      t.ok(id, 'it printed the order id')
      await outboxEmpty()
      const stored = (await messages('orders', 2)).filter((m) => m.key === id)
      t.same(
        stored.map((m) => m.value),
        [{ type: 'order.created', order: { id, total: 42.5 } }],
        'one message for the order',
      )
      t.equal((await pool.query('SELECT count(*)::int AS n FROM orders WHERE id = $1', [id])).rows[0].n, 1, 'and the order row')
    }
  })
}

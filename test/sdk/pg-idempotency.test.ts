/**
 * PgIdempotencyStore against a real PostgreSQL database, through the consumer helper's `handle` in
 * auto mode (no broker: the pushes are made and signed here): two consumers with their own pools
 * taking the same message at once (the second waits in its INSERT for the first to commit or roll
 * back), a handler that swallows a failed statement (COMMIT answers ROLLBACK), a database that is
 * down, the table options, and prune.
 */
import t from '../helpers/tap.ts'
import type pg from 'pg'
import { createConsumer, PgIdempotencyStore, type ConsumerErrorStage, type PushMessage } from '@hookq/client/consumer'
import { needsServer, type TeardownHost } from '../helpers/db.ts'
import { testPool } from '../helpers/pg-pool.ts'
import { consumerDatabase } from '../helpers/sdk.ts'
import { waitUntil } from '../helpers/wait.ts'
import { signedPush } from '../helpers/push.ts'

// The embedded database takes one connection: no second consumer could wait on a lock there.
const server = { skip: needsServer }

const secret = `whsec_${Buffer.alloc(32, 9).toString('base64')}`

function envelope(over: Record<string, unknown> = {}): string {
  const now = new Date().toISOString()
  return JSON.stringify({
    deliveryId: 'd-1',
    topic: 'orders',
    group: 'billing',
    partition: 0,
    offset: 7,
    key: null,
    value: { cents: 250 },
    headers: {},
    attempt: 1,
    timestamp: now,
    ackDeadline: now,
    ...over,
  })
}

/** A push of `body` signed with `secret` now, as the broker sends it. */
const signed = (body: string, id = 'msg_1_0_7') => signedPush(body, secret, id)

/** The consumer's own database; `pool` is the test's, `newPool()` a consumer process's. */
const consumerDb = (tt: TeardownHost) => consumerDatabase(tt, 'webhook_id text NOT NULL, by text NOT NULL, cents int NOT NULL', 2)

/** An auto-mode consumer (no API calls) on its own pool, as a consumer process would be. */
function consumerOn(
  pool: pg.Pool,
  by: string,
  handler: (m: PushMessage<{ cents: number }>, tx: pg.PoolClient) => Promise<void>,
  table?: string,
) {
  const errors: { stage: ConsumerErrorStage; error: unknown }[] = []
  const runs: string[] = []
  const consumer = createConsumer<{ cents: number }, pg.PoolClient>({
    secret,
    ackMode: 'auto',
    idempotency: new PgIdempotencyStore({ pool, ...(table ? { table } : {}) }),
    onError: (error, { stage }) => {
      errors.push({ stage, error })
    },
    async handler(m, { tx }) {
      runs.push(m.webhookId)
      await tx.query('INSERT INTO effects (webhook_id, by, cents) VALUES ($1, $2, $3)', [m.webhookId, by, m.value.cents])
      await handler(m, tx)
    },
  })
  return { consumer, errors, runs }
}

/** A promise and its resolve, to hold a handler mid-transaction until the test lets it go. */
function gate() {
  let open!: () => void
  const closed = new Promise<void>((resolve) => {
    open = resolve
  })
  return { closed, open }
}

/** Backends of this database waiting for a lock in the store's INSERT: the second push, blocked. */
async function waitingInserts(admin: pg.Pool): Promise<number> {
  const { rows } = await admin.query(`SELECT count(*)::int AS n FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "hookq_handled"%'`)
  return rows[0].n
}

t.test('the same message in two consumers at once: the second waits in its INSERT, then is a duplicate', server, async (t) => {
  const db = await consumerDb(t)
  const held = gate()
  let written = false
  const a = consumerOn(db.newPool(), 'a', async () => {
    written = true
    await held.closed
  })
  const b = consumerOn(db.newPool(), 'b', async () => {})
  const push = signed(envelope())

  t.teardown(held.open) // should the test fail before it lets a go: the pools can end
  const first = a.consumer.handle(push)
  await waitUntil(() => written, 10_000, 'a wrote, its transaction open')
  const second = b.consumer.handle(signed(envelope({ deliveryId: 'd-2', attempt: 2 })))
  await waitUntil(async () => (await waitingInserts(db.pool)) === 1, 10_000, "b blocked on a's uncommitted id")
  t.same(b.runs, [], "b has not run the handler while a's transaction is open")
  held.open()
  t.match(await first, { status: 200, body: '{"outcome":"handled"}' })
  t.match(await second, { status: 200, body: '{"outcome":"duplicate"}' }, "b found a's committed id")
  t.same(b.runs, [], 'b never ran the handler')
  const { rows } = await db.pool.query('SELECT by FROM effects')
  t.same(rows, [{ by: 'a' }], 'the effect happened once')
  t.same((await db.pool.query('SELECT id FROM hookq_handled')).rows, [{ id: 'billing/msg_1_0_7' }], 'the key is <group>/<webhook-id>')
})

t.test('the same message in two consumers at once, the first rolling back: the second runs it', server, async (t) => {
  const db = await consumerDb(t)
  const held = gate()
  let written = false
  const a = consumerOn(db.newPool(), 'a', async () => {
    written = true
    await held.closed
    throw new Error('a failed after its write')
  })
  const b = consumerOn(db.newPool(), 'b', async () => {})

  t.teardown(held.open)
  const first = a.consumer.handle(signed(envelope()))
  await waitUntil(() => written, 10_000, 'a wrote, its transaction open')
  const second = b.consumer.handle(signed(envelope({ deliveryId: 'd-2', attempt: 2 })))
  await waitUntil(async () => (await waitingInserts(db.pool)) === 1, 10_000, "b blocked on a's uncommitted id")
  held.open()
  t.match(await first, { status: 500, body: '{"error":"handler_failed"}' })
  t.match(await second, { status: 200, body: '{"outcome":"handled"}' }, 'a rolled back: b inserted the id and ran the handler')
  t.same((await db.pool.query('SELECT by FROM effects')).rows, [{ by: 'b' }], "a's write is gone, b's stays: once")
  t.same(
    a.errors.map((e) => e.stage),
    ['handler'],
  )
})

t.test('a handler that catches a failed statement and returns: COMMIT rolls back, so the message fails', server, async (t) => {
  const db = await consumerDb(t)
  let swallow = true
  const c = consumerOn(db.newPool(), 'c', async (_m, tx) => {
    if (!swallow) return
    try {
      await tx.query('SELECT 1 / 0')
    } catch {} // the transaction is aborted now; PostgreSQL answers the COMMIT with ROLLBACK
  })
  const answer = await c.consumer.handle(signed(envelope()))
  t.match(answer, { status: 500, body: '{"error":"commit_failed"}' }, 'not acked: nothing was recorded')
  t.same(
    c.errors.map((e) => e.stage),
    ['idempotency'],
  )
  t.match(c.errors[0]!.error, { message: /rolled back at COMMIT/ })
  t.same((await db.pool.query('SELECT * FROM effects')).rows, [], 'the write before the failed statement is gone')
  t.same((await db.pool.query('SELECT * FROM hookq_handled')).rows, [], 'and the id is not recorded')
  swallow = false
  t.match(
    await c.consumer.handle(signed(envelope({ attempt: 2 }))),
    { status: 200, body: '{"outcome":"handled"}' },
    'the redelivery runs it',
  )
  t.equal((await db.pool.query('SELECT * FROM effects')).rowCount, 1)
})

t.test('a database that is down: 503 and the handler not run; a failed COMMIT is a failed message', server, async (t) => {
  // Nothing listens on the discard port.
  const down = testPool(t, 'postgresql://postgres@127.0.0.1:9/none', 1)
  const c = consumerOn(down, 'c', async () => {})
  t.match(await c.consumer.handle(signed(envelope())), { status: 503, body: '{"error":"idempotency_store_failed"}' })
  t.same(c.runs, [], 'not run when the id cannot be recorded with it')
  t.same(
    c.errors.map((e) => e.stage),
    ['idempotency'],
  )
  // A batch likewise: 503, not 200 naming every message as failed (nor a nack for each).
  const batch = `{"deliveries":[${envelope()},${envelope({ deliveryId: 'd-2', offset: 8 })}]}`
  t.match(await c.consumer.handle(signed(batch, 'batch_d-1')), { status: 503, body: '{"error":"idempotency_store_failed"}' })
  t.same(c.runs, [], 'no message of the batch run')

  // The connection dies in the handler, after its write: the COMMIT cannot be sent.
  const db = await consumerDb(t)
  const lost = consumerOn(db.newPool(), 'lost', async (_m, tx) => {
    await tx.query('SELECT pg_terminate_backend(pg_backend_pid())').catch(() => {})
  })
  t.match(
    await lost.consumer.handle(signed(envelope())),
    { status: 500, body: '{"error":"commit_failed"}' },
    'the handler returned, the COMMIT could not be sent: failed, to be pushed again',
  )
  t.same(
    lost.errors.map((e) => e.stage),
    ['idempotency'],
  )
  t.same((await db.pool.query('SELECT * FROM effects')).rows, [], 'nothing committed')
  t.same((await db.pool.query('SELECT * FROM hookq_handled')).rows, [])
})

t.test('table: a schema-qualified name, names refused, createTable false with createTableSql', server, async (t) => {
  const db = await consumerDb(t)
  await db.pool.query('CREATE SCHEMA app')
  const c = consumerOn(db.newPool(), 'c', async () => {}, 'app.Handled_Ids')
  t.match(await c.consumer.handle(signed(envelope())), { status: 200, body: '{"outcome":"handled"}' })
  t.same((await db.pool.query('SELECT id FROM app."Handled_Ids"')).rows, [{ id: 'billing/msg_1_0_7' }], 'created there, its case kept')
  const { rows: columns } = await db.pool.query(`SELECT column_name, data_type, is_nullable FROM information_schema.columns
    WHERE table_schema = 'app' AND table_name = 'Handled_Ids' ORDER BY ordinal_position`)
  t.same(columns, [
    { column_name: 'id', data_type: 'text', is_nullable: 'NO' },
    { column_name: 'handled_at', data_type: 'timestamp with time zone', is_nullable: 'NO' },
  ])

  const pool = db.newPool()
  for (const table of ['', 'a.b.c', 'x; DROP TABLE effects', 'name"quoted', '1st', 'a'.repeat(64)]) {
    t.throws(() => new PgIdempotencyStore({ pool, table }), TypeError, JSON.stringify(table))
  }
  t.throws(() => new PgIdempotencyStore({ pool: {} as pg.Pool }), TypeError, 'no pool')

  const manual = new PgIdempotencyStore({ pool, table: 'managed', createTable: false })
  const m = createConsumer({ secret, ackMode: 'auto', idempotency: manual, onError: () => {}, handler: () => {} })
  t.match(await m.handle(signed(envelope())), { status: 503 }, 'no table, and not created: the INSERT fails before the handler')
  t.match(
    manual.createTableSql,
    /^CREATE TABLE IF NOT EXISTS "managed" \(id text PRIMARY KEY, handled_at timestamptz NOT NULL DEFAULT now\(\)\);\nCREATE INDEX IF NOT EXISTS "managed_handled_at" ON "managed" \(handled_at\);$/,
  )
  await db.pool.query(manual.createTableSql)
  t.match(await m.handle(signed(envelope())), { status: 200, body: '{"outcome":"handled"}' }, 'after the statement is run by hand')
})

t.test('stores of several processes creating the table at once all succeed', server, async (t) => {
  const db = await consumerDb(t)
  // Each with its own pool, as separate processes would: CREATE ... IF NOT EXISTS races between them.
  const stores = Array.from({ length: 6 }, () => new PgIdempotencyStore({ pool: db.newPool(), table: 'raced' }))
  const results = await Promise.allSettled(stores.map((s) => s.runOnce(['x'], async () => {})))
  t.same(
    results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : [])),
    [],
    'none failed',
  )
  t.same(
    results.flatMap((r) => (r.status === 'fulfilled' ? r.value : [])),
    ['x'],
    'recorded by one of them only',
  )
})

t.test('prune deletes the ids older than the limit, and says how many', server, async (t) => {
  const db = await consumerDb(t)
  const store = new PgIdempotencyStore({ pool: db.newPool() })
  t.same(await store.runOnce(['g/a', 'g/b', 'g/c'], async () => {}), ['g/a', 'g/b', 'g/c'])
  t.same(await store.runOnce(['g/a', 'g/d'], async () => {}), ['g/d'], 'only the new ids of a batch are fresh')
  await db.pool.query(`UPDATE hookq_handled SET handled_at = now() - interval '9 days' WHERE id IN ('g/a', 'g/b')`)
  t.equal(await store.prune({ olderThanMs: 8 * 86_400_000 }), 2)
  t.same(
    (await db.pool.query('SELECT id FROM hookq_handled ORDER BY id')).rows.map((r) => r.id),
    ['g/c', 'g/d'],
  )
  t.same(await store.runOnce(['g/a'], async () => {}), ['g/a'], 'a pruned id is new again')
  await t.rejects(store.prune({ olderThanMs: -1 }), RangeError)
})

/**
 * Exactly-once effects with PgIdempotencyStore, against the real broker over HTTP and a real
 * PostgreSQL database of the consumer's own: the example docs/consumer-helper.md shows, run as a file, a message's write
 * and its id committed in one transaction before the ack, a committed message pushed again (a lost
 * ack, a seek back) acked without the handler, a throwing handler's writes rolled back and run
 * again, and batch pushes (a transaction per message, or one for a batch handler's batch, which
 * gets only the batch's messages not handled before).
 * test/sdk/consumer-exactly-once-kill.test.ts kills consumer processes mid-message.
 */
import t from '../helpers/tap.ts'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type pg from 'pg'
import { unwrap, type GroupConfig } from '@hookq/client'
import { createConsumer, PgIdempotencyStore, type ConsumerErrorStage } from '@hookq/client/consumer'
import { generateSecret } from '../../src/core/signature.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'
import { consumerDatabase, sdkApi, serve, spawnConsumer } from '../helpers/sdk.ts'
import { waitUntil } from '../helpers/wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))
const { url } = await startListeningBroker(t)
const { hookq, setupWithConsumer, produceValues, lagZero, deliveriesWhen, seekToStart, droppingAcks } = sdkApi(url)
// The embedded database takes one connection: the broker's, and none left for a consumer.
const server = { skip: needsServer }

const quickRetry = { initialDelayMs: 100, maxDelayMs: 100, multiplier: 1, jitter: 0 }
/** The consumer's effects: `txid` tells which transaction wrote each. */
const EFFECTS = 'webhook_id text NOT NULL, value int NOT NULL, attempt int NOT NULL, txid bigint NOT NULL DEFAULT txid_current()'

const INSERT_EFFECT = 'INSERT INTO effects (webhook_id, value, attempt) VALUES ($1, $2, $3)'

t.test(
  "docs/consumer-helper.md's exactly-once consumer: the text of examples/consumer-exactly-once.mjs, run as a file",
  server,
  async (t) => {
    const example = await readFile(path.join(root, 'examples/consumer-exactly-once.mjs'), 'utf8')
    const readme = await readFile(path.join(root, 'docs/consumer-helper.md'), 'utf8')
    const shown = /<!-- examples\/consumer-exactly-once\.mjs -->\n```js\n([\s\S]*?)```\n/.exec(readme)?.[1]
    t.equal(shown, example, 'docs/consumer-helper.md shows examples/consumer-exactly-once.mjs exactly')

    const db = await consumerDatabase(t, EFFECTS)
    const secret = generateSecret()
    const running = await spawnConsumer(t, 'examples/consumer-exactly-once.mjs', {
      HOOKQ_URL: url,
      HOOKQ_WEBHOOK_SECRET: secret,
      DATABASE_URL: db.url,
      PORT: '0',
    })
    await setupWithConsumer('payments', { retry: quickRetry }, running.url, secret)

    await produceValues('payments', [
      { account: 'a', cents: 250 },
      { account: 'a', cents: 100 },
      { account: 'b', cents: 5 },
    ])
    await lagZero('payments')
    const balances = () => db.rows('SELECT account, cents::int FROM balances ORDER BY account')
    t.same(
      await balances(),
      [
        { account: 'a', cents: 350 },
        { account: 'b', cents: 5 },
      ],
      'each payment counted once',
    )

    await seekToStart('payments')
    await deliveriesWhen('payments', (d) => d.filter((x) => x.outcome === 'acked' && x.statusCode === 200).length === 6)
    t.same(
      await balances(),
      [
        { account: 'a', cents: 350 },
        { account: 'b', cents: 5 },
      ],
      'all three pushed and acked again, and counted once',
    )
    t.equal((await db.rows('SELECT id FROM hookq_handled')).length, 3, 'three ids recorded')
    t.equal(running.output().trim().split('\n').length, 1, `nothing printed but the listening line: ${running.output()}`)
  },
)

t.test('a message handled once: its write and its id commit in one transaction, and it is acked', server, async (t) => {
  const db = await consumerDatabase(t, EFFECTS)
  const secret = generateSecret()
  const consumer = createConsumer<number, pg.PoolClient>({
    secret,
    baseUrl: url,
    idempotency: new PgIdempotencyStore({ pool: db.pool }),
    handler: async (m, { tx }) => {
      await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
    },
  })
  await setupWithConsumer('once', {}, await serve(t, consumer.listener), secret)
  await produceValues('once', [41])
  await lagZero('once')

  const [effect, ...more] = await db.rows('SELECT webhook_id, value, xmin::text AS xmin FROM effects')
  const handled = await db.rows('SELECT id, xmin::text AS xmin, handled_at FROM hookq_handled')
  t.same(more, [], 'one effect')
  t.match(effect, { value: 41, webhook_id: /^msg_\d+_0_0$/ })
  t.same(
    handled.map((h) => h.id),
    [`once/${effect.webhook_id}`],
    'the id is <group>/<webhook-id>',
  )
  t.equal(handled[0].xmin, effect.xmin, 'written by the same transaction')
  t.ok(handled[0].handled_at instanceof Date)
  const log = await deliveriesWhen('once', (d) => d.length === 1 && d[0]!.statusCode !== null)
  t.match(log, [{ attempt: 1, outcome: 'acked', statusCode: 200 }], 'acked (before the 200 answer)')
})

t.test('a committed message pushed again (a lost ack, a seek back) is acked without running the handler', server, async (t) => {
  const db = await consumerDatabase(t, EFFECTS)
  const secret = generateSecret()
  let runs = 0
  let pushes = 0
  const stages: ConsumerErrorStage[] = []
  const consumer = createConsumer<number, pg.PoolClient>({
    secret,
    client: droppingAcks(1),
    idempotency: new PgIdempotencyStore({ pool: db.pool }),
    onError: (_e, { stage }) => {
      stages.push(stage)
    },
    handler: async (m, { tx }) => {
      runs++
      await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
    },
  })
  await setupWithConsumer(
    'redelivered',
    { retry: quickRetry },
    await serve(t, (req, res) => {
      pushes++
      consumer.listener(req, res)
    }),
    secret,
  )
  await produceValues('redelivered', [7])
  await lagZero('redelivered')
  t.equal(pushes, 2, 'pushed twice: the first ack was lost after the COMMIT')
  t.equal(runs, 1, 'the second push found the id and ran nothing')
  t.same(stages, ['ack'])
  const log = await deliveriesWhen('redelivered', (d) => d.length === 2 && d.every((x) => x.statusCode !== null))
  t.match(log, [
    { attempt: 1, outcome: 'failed', statusCode: 500 },
    { attempt: 2, outcome: 'acked', statusCode: 200 },
  ])

  await seekToStart('redelivered')
  await waitUntil(() => pushes === 3, 20_000, 'the push after the seek')
  await lagZero('redelivered')
  t.equal(runs, 1, 'the replay was acked without the handler')
  t.same(await db.rows('SELECT value, attempt FROM effects'), [{ value: 7, attempt: 1 }], 'the effect exists once')
})

t.test('a handler that throws after its write: nothing of it commits, the id is not recorded, and the retry runs it', server, async (t) => {
  const db = await consumerDatabase(t, EFFECTS)
  const secret = generateSecret()
  const seenAtFailure: unknown[] = []
  const consumer = createConsumer<number, pg.PoolClient>({
    secret,
    baseUrl: url,
    nackDelayMs: 200,
    idempotency: new PgIdempotencyStore({ pool: db.pool }),
    onError: () => {},
    handler: async (m, { tx }) => {
      await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
      if (m.attempt === 1) {
        // What another connection sees at this moment: nothing yet, the write is uncommitted.
        seenAtFailure.push((await db.pool.query('SELECT count(*)::int AS n FROM effects')).rows[0].n)
        throw new Error('the payment provider said no')
      }
    },
  })
  await setupWithConsumer('throws', { retry: { initialDelayMs: 60_000 } }, await serve(t, consumer.listener), secret)
  await produceValues('throws', [3])
  await lagZero('throws')
  t.same(seenAtFailure, [0])
  t.same(
    await db.rows('SELECT value, attempt FROM effects'),
    [{ value: 3, attempt: 2 }],
    "attempt 1's write rolled back; attempt 2's committed",
  )
  t.equal((await db.rows('SELECT id FROM hookq_handled')).length, 1, 'recorded once, by attempt 2')
  const log = await deliveriesWhen('throws', (d) => d.length === 2 && d.every((x) => x.statusCode !== null))
  t.match(
    log,
    [
      { attempt: 1, outcome: 'nacked', statusCode: 500 },
      { attempt: 2, outcome: 'acked', statusCode: 200 },
    ],
    "nacked with its 200 ms delay (not the group's minute of backoff), then handled",
  )
})

t.test('batch push, a transaction per message: failures come back alone, a lost ack runs nothing again', server, async (t) => {
  const db = await consumerDatabase(t, EFFECTS)
  const secret = generateSecret()
  const calls: { value: number; attempt: number }[] = []
  let batches = 0
  const consumer = createConsumer<number, pg.PoolClient>({
    // The first batch's ack is lost: all of it comes back, its committed messages as duplicates.
    secret,
    client: droppingAcks(1),
    idempotency: new PgIdempotencyStore({ pool: db.pool }),
    onError: () => {},
    handler: async (m, { tx }) => {
      calls.push({ value: m.value, attempt: m.attempt })
      await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
      if (m.value % 7 === 0 && m.attempt === 1) throw new Error(`not yet: ${m.value}`)
    },
  })
  const base = await serve(t, (req, res) => {
    batches++
    consumer.listener(req, res)
  })
  await setupWithConsumer('batch-each', { batch: { maxMessages: 25 }, retry: quickRetry, maxDeliveries: 10 }, base, secret)
  await produceValues(
    'batch-each',
    Array.from({ length: 30 }, (_, i) => i),
  )
  await lagZero('batch-each')

  const effects = await db.rows('SELECT value, attempt, txid::text AS txid FROM effects ORDER BY value')
  t.same(
    effects.map((e) => e.value),
    Array.from({ length: 30 }, (_, i) => i),
    "every message's effect exactly once",
  )
  t.same(
    effects.filter((e) => e.value % 7 === 0).map((e) => e.attempt > 1),
    [true, true, true, true, true],
    "the failed ones' first writes rolled back; their retries committed",
  )
  t.equal(new Set(effects.map((e) => e.txid)).size, 30, 'a transaction per message')
  t.equal((await db.rows('SELECT id FROM hookq_handled')).length, 30)
  t.equal(calls.length, 35, 'each handled once, and the five that failed once more')
  t.ok(batches < 30, `several messages a push (${batches} pushes)`)
  const log = await deliveriesWhen('batch-each', (d) => d.filter((x) => x.outcome === 'acked').length === 30)
  const again = new Set(log.filter((x) => x.attempt > 1).map((x) => x.offset))
  t.ok(
    again.size > 5,
    `messages besides the five came back after the lost ack (${again.size} pushed again); the 35 calls above show they ran nothing`,
  )
})

t.test('batch push with a batch handler: one transaction for the batch, all or nothing', server, async (t) => {
  const db = await consumerDatabase(t, EFFECTS)
  const secret = generateSecret()
  const calls: { values: number[]; attempts: number[] }[] = []
  const consumer = createConsumer<number, pg.PoolClient>({
    secret,
    baseUrl: url,
    idempotency: new PgIdempotencyStore({ pool: db.pool }),
    onError: () => {},
    handler: () => {
      throw new Error('not used with a batch handler')
    },
    batchHandler: async (messages, { tx }) => {
      calls.push({ values: messages.map((m) => m.value), attempts: messages.map((m) => m.attempt) })
      for (const m of messages) await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
      // Named as failed: with a transactional store the whole batch rolls back and comes back.
      return { failed: messages.filter((m) => m.value === 7 && m.attempt === 1).map((m) => m.deliveryId) }
    },
  })
  // maxWaitMs: the ten messages gather into one batch, so 7 fails a batch with others in it.
  await setupWithConsumer(
    'batch-whole',
    { batch: { maxMessages: 25, maxWaitMs: 200 }, retry: quickRetry },
    await serve(t, consumer.listener),
    secret,
  )
  await produceValues(
    'batch-whole',
    Array.from({ length: 10 }, (_, i) => i),
  )
  await lagZero('batch-whole')

  const effects = await db.rows('SELECT value, txid::text AS txid FROM effects ORDER BY value')
  t.same(
    effects.map((e) => e.value),
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    "every message's effect exactly once",
  )
  const first = calls.find((c) => c.values.includes(7) && c.attempts[c.values.indexOf(7)] === 1)!
  t.ok(first.values.length > 1, `7 failed a batch of several (${first.values})`)
  t.ok(
    first.values.every((v) => calls.some((c) => c !== first && c.values.includes(v))),
    'every message of that batch came back',
  )
  const txids = new Set(effects.map((e) => e.txid))
  t.ok(txids.size < effects.length, `several messages a transaction (${txids.size} for ${effects.length})`)
  t.equal((await db.rows('SELECT id FROM hookq_handled')).length, 10)
})

t.test(
  'batch push with a batch handler: only the fresh messages of a batch reach it; the duplicates in it are acked without it',
  server,
  async (t) => {
    const db = await consumerDatabase(t, EFFECTS)
    const secret = generateSecret()
    const calls: number[][] = []
    const stages: ConsumerErrorStage[] = []
    const consumer = createConsumer<number, pg.PoolClient>({
      secret,
      baseUrl: url,
      idempotency: new PgIdempotencyStore({ pool: db.pool }),
      onError: (_e, { stage }) => {
        stages.push(stage)
      },
      handler: () => {
        throw new Error('not used with a batch handler')
      },
      batchHandler: async (messages, { tx }) => {
        calls.push(messages.map((m) => m.value))
        for (const m of messages) await tx.query(INSERT_EFFECT, [m.webhookId, m.value, m.attempt])
      },
    })
    // The offsets each push carried, read before the consumer handles it.
    const pushes: number[][] = []
    const base = await serve(t, (req, res) => {
      const chunks: Buffer[] = []
      req.on('data', (c: Buffer) => chunks.push(c))
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8')
        pushes.push((JSON.parse(body) as { deliveries: { offset: number }[] }).deliveries.map((d) => d.offset))
        consumer.handle({ headers: req.headers, body }).then((answer) => res.writeHead(answer.status, answer.headers).end(answer.body))
      })
    })
    const group = 'batch-fresh'
    const settings = { topic: group, batch: { maxMessages: 25, maxWaitMs: 200 }, retry: quickRetry }
    const paused = async (on: boolean) => {
      await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group } }, body: { ...settings, paused: on } as GroupConfig }))
    }
    await setupWithConsumer(group, settings, base, secret)
    const ackedOffsets = async (n: number) =>
      (await deliveriesWhen(group, (d) => d.filter((x) => x.outcome === 'acked').length === n))
        .filter((x) => x.outcome === 'acked')
        .map((x) => x.offset)
        .sort((a, b) => a - b)

    // 0-2 are handled and acked.
    await produceValues(group, [0, 1, 2])
    await lagZero(group)
    t.same(calls.flat(), [0, 1, 2], 'the first three handled')

    // While the group is paused, 3-5 are produced and the partition is sought back to 0: unpaused,
    // it pushes 0-5 together, 0-2 handled before and 3-5 not.
    await paused(true)
    await produceValues(group, [3, 4, 5])
    await seekToStart(group)
    const pushesBefore = pushes.length
    const callsBefore = calls.length
    await paused(false)
    await lagZero(group)
    const mixed = pushes.slice(pushesBefore).filter((p) => p.some((o) => o < 3) && p.some((o) => o >= 3))
    t.ok(mixed.length > 0, `a push carried handled and fresh messages together: ${JSON.stringify(pushes.slice(pushesBefore))}`)
    t.same(calls.slice(callsBefore).flat(), [3, 4, 5], 'the batch handler got the fresh ones only, each once')
    t.same(await ackedOffsets(9), [0, 0, 1, 1, 2, 2, 3, 4, 5], 'and all six were acked: the duplicates without the handler')

    // Once more from 0: a batch of nothing but duplicates does not call the batch handler at all.
    const callsAfter = calls.length
    await seekToStart(group)
    await lagZero(group)
    t.equal(calls.length, callsAfter, 'no call for a batch of duplicates')
    t.same(await ackedOffsets(15), [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5], 'yet every message acked again')

    t.same(
      (await db.rows('SELECT value FROM effects ORDER BY value')).map((e) => e.value),
      [0, 1, 2, 3, 4, 5],
      "every message's effect exactly once",
    )
    t.equal((await db.rows('SELECT id FROM hookq_handled')).length, 6, 'six ids recorded')
    t.same(stages, [], 'nothing reported: a duplicate is not an error')
  },
)

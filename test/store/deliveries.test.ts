/**
 * The attempt rows as the dispatcher writes them (insertAttempts, updateAttempts) read back through
 * the deliveries listing: every field, timestamps exact to the millisecond (they travel as epoch
 * milliseconds in hand-written array literals, src/store/arrays.ts), nulls kept, and updates
 * merging over what is there. Also the literals themselves.
 */
import t from '../helpers/tap.ts'
import { epochMsArray, numberArray, textColumn } from '../../src/store/arrays.ts'
import { AttemptLog } from '../../src/dispatch/attempt-log.ts'
import { insertAttempts, listAttempts, updateAttempts } from '../../src/store/deliveries.ts'
import { newDeliveryId, parseDeliveryId } from '../../src/core/delivery-id.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'

// One broker and database for the file: each test works on a group of its own (and its own rows,
// found by group id), so none sees another's; a broker each cost a database and a start-up a test.
const broker = await startBroker(t)

/** A topic `name` and a group `name-g` on it; their ids, and attempt rows of the group's partition 0. */
async function groupSetup(t: { equal(a: unknown, b: unknown): unknown }, name: string, partitions = 1) {
  const { call, sql } = api(broker)
  t.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  t.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name })).status, 201)
  const groupId = (await sql('SELECT id FROM consumer_groups WHERE name = $1', [`${name}-g`]))[0]!.id as number
  const topicId = (await sql('SELECT id FROM topics WHERE name = $1', [name]))[0]!.id as number
  /** Attempt 1 of `offset`, started now, in flight. */
  const row = (offset: number) => ({
    id: newDeliveryId({ groupId, partition: 0, offset, attempt: 1 }),
    groupId,
    topicId,
    partition: 0,
    offset,
    attempt: 1,
    consumerId: 'c',
    startedAtMs: Date.now(),
    ackDeadlineMs: Date.now() + 30_000,
  })
  return { broker, groupId, topicId, row }
}

t.test('array literals', async (t) => {
  t.equal(numberArray([]), '{}')
  t.equal(numberArray([1, -2, null, undefined, 9007199254740991]), '{1,-2,NULL,NULL,9007199254740991}')
  t.equal(epochMsArray([new Date(1764567890123), null]), '{1764567890123,NULL}')
  t.throws(() => numberArray([Number.NaN]), TypeError)
  t.throws(() => numberArray([Infinity]), TypeError)
})

t.test('text array literals come back from PostgreSQL as they went', async (t) => {
  const values = [
    '',
    'NULL',
    'null',
    'a,b',
    '{x}',
    ' spaced ',
    'q"uote',
    'back\\slash',
    '\\"',
    '"',
    'ünï\u2028😀',
    'new\nline',
    null,
    undefined,
  ]
  const literal = textColumn(values, (v) => v)
  const { rows } = await broker.db.pool.query<{ a: (string | null)[] }>('SELECT $1::text[] AS a', [literal])
  t.same(
    rows[0]!.a,
    values.map((v) => v ?? null),
  )
  t.equal(
    textColumn([], (v: string) => v),
    '{}',
  )
})

t.test('delivery ids carry their coordinates and 128 random bits', async (t) => {
  const key = { groupId: 7, partition: 3, offset: 2 ** 45 + 1, attempt: 4 }
  const a = newDeliveryId(key)
  const b = newDeliveryId(key)
  t.match(a, /^[A-Za-z0-9_-]{48}$/)
  t.not(a, b, 'same coordinates, different ids')
  t.same(parseDeliveryId(a), key)
  for (const offset of [0, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, Number.MAX_SAFE_INTEGER])
    t.same(parseDeliveryId(newDeliveryId({ ...key, offset })), { ...key, offset }, `offset ${offset}`)
  for (const bad of ['', 'x', a.slice(1), `${a}A`, `${a.slice(0, 47)}.`, 'd1', '\u0000'.repeat(48)])
    t.equal(parseDeliveryId(bad), null, `not ours: ${JSON.stringify(bad)}`)
})

t.test('attempt rows round-trip through the database', async (t) => {
  const { broker, groupId, topicId } = await groupSetup(t, 'att', 2)
  const { sql } = api(broker)

  // Odd milliseconds across a wide range of dates: each must come back exactly.
  const base = Date.UTC(2026, 11, 1, 5, 44, 50, 7)
  const at = (k: number) => new Date(base + k * 86_400_123 + (k % 1000))
  const rows = Array.from({ length: 300 }, (_, i) => ({
    id: newDeliveryId({ groupId, partition: i % 2, offset: 2 ** 40 + i, attempt: 1 + (i % 3) }),
    groupId,
    topicId,
    partition: i % 2,
    offset: 2 ** 40 + i,
    attempt: 1 + (i % 3),
    consumerId: i % 5 === 0 ? null : `c${i % 5}`,
    startedAtMs: at(i - 150).getTime(),
    ackDeadlineMs: at(i - 149).getTime(),
    ...(i % 2 === 0 ? { outcome: 'acked' as const, finishedAtMs: at(i - 148).getTime(), statusCode: 200, durationMs: i } : {}),
  }))
  await insertAttempts(broker.db.pool, rows)
  // Updates: a full outcome for odd rows, a deadline change only for some even ones.
  await updateAttempts(
    broker.db.pool,
    rows
      .filter((_, i) => i % 2 === 1)
      .map((r, k) => ({
        id: r.id,
        outcome: 'failed' as const,
        finishedAtMs: at(k + 7).getTime(),
        statusCode: 503,
        durationMs: 5000 + k,
        error: `boom ${k} "quoted" \\ {brace}`,
      })),
  )
  await updateAttempts(
    broker.db.pool,
    rows.filter((_, i) => i % 4 === 0).map((r) => ({ id: r.id, ackDeadlineMs: at(999).getTime() })),
  )

  const listed = await listAttempts(broker.db.pool, groupId, { limit: 1000 })
  t.equal(listed.length, rows.length)
  const byId = new Map(listed.map((r) => [r.deliveryId, r]))
  let mismatches = 0
  for (const [i, r] of rows.entries()) {
    const got = byId.get(r.id)!
    const want = {
      partition: r.partition,
      offset: r.offset,
      attempt: r.attempt,
      consumerId: r.consumerId,
      startedAt: r.startedAtMs,
      outcome: i % 2 === 0 ? 'acked' : 'failed',
      finishedAt: i % 2 === 0 ? r.finishedAtMs! : at((i - 1) / 2 + 7).getTime(),
      statusCode: i % 2 === 0 ? 200 : 503,
      durationMs: i % 2 === 0 ? i : 5000 + (i - 1) / 2,
      error: i % 2 === 0 ? null : `boom ${(i - 1) / 2} "quoted" \\ {brace}`,
    }
    const have = {
      partition: got.partition,
      offset: Number(got.offset),
      attempt: got.attempt,
      consumerId: got.consumerId,
      startedAt: got.startedAt.getTime(),
      outcome: got.outcome,
      finishedAt: got.finishedAt?.getTime() ?? null,
      statusCode: got.statusCode,
      durationMs: got.durationMs,
      error: got.error,
    }
    if (JSON.stringify(have) !== JSON.stringify(want)) {
      if (mismatches++ < 5) t.same(have, want, `row ${i}`)
    }
  }
  t.equal(mismatches, 0, 'every row as written, to the millisecond')
  const deadlines = await sql(
    'SELECT id, (extract(epoch FROM ack_deadline) * 1000)::bigint::text AS ms FROM deliveries WHERE group_id = $1',
    [groupId],
  )
  const deadlineOf = new Map(deadlines.map((r) => [r.id as string, Number(r.ms)]))
  t.ok(
    rows.every((r, i) => deadlineOf.get(r.id) === (i % 4 === 0 ? at(999).getTime() : r.ackDeadlineMs)),
    'ack deadlines as written and as updated',
  )
})

t.test('a batch sent again after its answer was lost: the rows already there are skipped, the new ones written', async (t) => {
  const { broker, groupId, row } = await groupSetup(t, 'again')
  // Settled rows: the broker's own claim of the partition marks rows left in flight as failed.
  const settled = (offset: number) => ({ ...row(offset), outcome: 'acked' as const, finishedAtMs: Date.now() })
  const first = [settled(0), settled(1)]
  await insertAttempts(broker.db.pool, first)
  // The retry carries the same rows (an outcome learnt meanwhile merged into one) and a row that came since.
  await insertAttempts(broker.db.pool, [{ ...first[0]!, outcome: 'nacked' }, first[1]!, settled(2)])
  const listed = await listAttempts(broker.db.pool, groupId, { limit: 10 })
  t.same(
    listed.map((r) => [r.offset, r.outcome]).sort(),
    [
      [0, 'acked'],
      [1, 'acked'],
      [2, 'acked'],
    ],
    'each row once; a row already there keeps what it has (a later outcome comes by update)',
  )
})

t.test('a row PostgreSQL refuses fails alone: the rows around it are written, and it without its details', async (t) => {
  const { broker, groupId, row } = await groupSetup(t, 'bad')
  const errors: { err: unknown; dropped: number }[] = []
  const log = new AttemptLog(broker.db, {
    flushDelayMs: 1,
    holdMs: 60_000,
    maxBuffered: 10_000,
    onError: (err, dropped) => errors.push({ err, dropped }),
  })
  const rows = Array.from({ length: 9 }, (_, i) => row(i))
  for (const r of rows) log.started({ ...r, outcome: 'failed', finishedAtMs: Date.now(), statusCode: 500, durationMs: 3, error: 'boom' })
  // A duration past int4: the whole statement is refused (22003), again at every retry as it is.
  const bad = row(9)
  log.started({ ...bad, outcome: 'failed', finishedAtMs: Date.now(), statusCode: 500, durationMs: 2 ** 31, error: 'boom' })
  // An update refused the same way, to a row written as in_flight first.
  const late = row(10)
  log.started(late)
  await log.flush(true)
  log.update({ id: late.id, outcome: 'failed', finishedAtMs: Date.now(), statusCode: 70_000_000_000, error: 'late boom' })
  await log.flush(true)

  const listed = new Map((await listAttempts(broker.db.pool, groupId, { limit: 100 })).map((r) => [r.deliveryId, r]))
  t.equal(listed.size, 11, 'every row written')
  t.ok(
    rows.every((r) => listed.get(r.id)?.error === 'boom' && listed.get(r.id)?.durationMs === 3),
    'the rows around the bad one, as they were',
  )
  const b = listed.get(bad.id)
  t.equal(b?.outcome, 'failed', 'the bad row keeps its outcome')
  t.equal(b?.durationMs, null, 'and loses the value PostgreSQL refused')
  t.match(b?.error, /^attempt details not storable: .*out of range/, 'it says why')
  const l = listed.get(late.id)
  t.equal(l?.outcome, 'failed', 'the refused update still lands its outcome')
  t.match(l?.error, /^attempt details not storable/)
  t.same(errors, [], 'nothing dropped, nothing left to retry')
})

t.test('durable() rejects a row that was dropped instead of written', async (t) => {
  const { broker, groupId, topicId } = await groupSetup(t, 'dur')
  const errors: number[] = []
  const log = new AttemptLog(broker.db, {
    flushDelayMs: 1,
    holdMs: 60_000,
    maxBuffered: 10_000,
    onError: (_err, dropped) => errors.push(dropped),
  })
  // A start before PostgreSQL's timestamp range (271821 BC): refused with its details and without them (22008).
  const id = newDeliveryId({ groupId, partition: 0, offset: 0, attempt: 2 })
  const row = {
    id,
    groupId,
    topicId,
    partition: 0,
    offset: 0,
    attempt: 2,
    consumerId: 'c',
    startedAtMs: -8.64e15,
    ackDeadlineMs: -8.64e15,
  }
  await t.rejects(log.durable(row), /could not be recorded/, 'the caller learns the row is not on record, and does not push')
  t.same(errors, [1], 'the drop is reported')
  t.same(await listAttempts(broker.db.pool, groupId, { limit: 10 }), [], 'nothing written')
  await log.close()
})

t.test('finished rows wait for company N times as long with N processes, up to the cap', async (t) => {
  const { broker, groupId, row } = await groupSetup(t, 'shared')
  let processes = 1
  const standing = Date.now()
  const armed: number[] = []
  const log = new AttemptLog(broker.db, {
    flushDelayMs: 20,
    maxFlushDelayMs: 100,
    processes: () => processes,
    holdMs: 60_000,
    maxBuffered: 10_000,
    onError: () => {},
    // A clock that stands still and timers that only note the wait asked for: the test flushes by hand.
    now: () => standing,
    timers: {
      setTimeout: (_fn, ms) => {
        armed.push(ms)
        return {}
      },
      clearTimeout: () => {},
    },
  })
  const finished = (offset: number) => ({
    ...row(offset),
    outcome: 'acked' as const,
    finishedAtMs: Date.now(),
    statusCode: 200,
    durationMs: 1,
  })
  const waitFor = async (n: number, offset: number) => {
    processes = n
    armed.length = 0
    log.started(finished(offset))
    const ms = armed[0]
    await log.flush()
    return ms
  }
  t.equal(await waitFor(1, 0), 20, 'alone: flushDelayMs')
  t.equal(await waitFor(3, 1), 60, 'one of three: three times it')
  t.equal(await waitFor(8, 2), 100, 'one of eight: the cap')
  t.equal((await listAttempts(broker.db.pool, groupId, { limit: 10 })).length, 3, 'every row written')
  await log.close()
})

t.test('a flush that fails part-way keeps the outcomes that arrive afterwards', async (t) => {
  const { broker, groupId, row } = await groupSetup(t, 'part')
  const errors: unknown[] = []
  const log = new AttemptLog(broker.db, { flushDelayMs: 60_000, holdMs: 60_000, maxBuffered: 10_000, onError: (err) => errors.push(err) })
  const a = row(0)
  const b = row(1)
  log.started(a)
  await log.flush(true) // a is written as in_flight
  // Updates fail for now (not for their data: the database is at fault, so they are kept).
  await broker.db.pool.query(
    `CREATE FUNCTION refuse_updates() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'updates refused' USING ERRCODE = '57P03'; END $$`,
  )
  await broker.db.pool.query('CREATE TRIGGER refuse_updates BEFORE UPDATE ON deliveries FOR EACH ROW EXECUTE FUNCTION refuse_updates()')
  log.update({ id: a.id, outcome: 'acked', finishedAtMs: Date.now(), statusCode: 200 })
  log.started(b)
  await log.flush(true) // b's INSERT lands; a's UPDATE fails
  t.equal(errors.length, 1, 'the flush failed part-way')
  log.update({ id: b.id, outcome: 'failed', finishedAtMs: Date.now(), statusCode: 503, error: 'busy' })
  await broker.db.pool.query('DROP TRIGGER refuse_updates ON deliveries')
  await log.flush(true)
  await log.close()
  const listed = new Map((await listAttempts(broker.db.pool, groupId, { limit: 10 })).map((r) => [r.deliveryId, r]))
  t.match(listed.get(a.id), { outcome: 'acked', statusCode: 200 }, 'the failed update is written at the retry')
  t.match(listed.get(b.id), { outcome: 'failed', statusCode: 503, error: 'busy' }, 'the outcome that came after the failure is written too')
})

t.test('outcomes of rows written in flight land wherever their rows are filed, bounded by their start or not', async (t) => {
  const { broker, groupId, row } = await groupSetup(t, 'filed')
  const { sql } = api(broker)
  const log = new AttemptLog(broker.db, { flushDelayMs: 60_000, holdMs: 60_000, maxBuffered: 10_000, onError: (err) => t.error(err) })
  const rows = [row(0), row(1), row(2)]
  for (const r of rows) log.started(r)
  await log.flush(true) // all three written as in_flight, their starts known to the log
  // Row 1 filed later (as a copy forward by a process whose clock is ahead files it), row 2
  // earlier (a process whose clock is behind): the bounded update misses both, and must not leave
  // them unwritten.
  await sql(`UPDATE deliveries SET filed_at = filed_at + interval '2 minutes' WHERE id = $1`, [rows[1]!.id])
  await sql(`UPDATE deliveries SET filed_at = filed_at - interval '1 hour' WHERE id = $1`, [rows[2]!.id])
  const finished = Date.now()
  for (const r of rows) log.update({ id: r.id, outcome: 'acked', finishedAtMs: finished, statusCode: 200 })
  await log.flush(true)
  // Statements as they go: one when the bound holds, the unbounded one after it when it does not.
  const statements: string[] = []
  const counting = {
    query: (text: string, values?: unknown[]) => {
      statements.push(text)
      return broker.db.pool.query(text, values)
    },
  } as unknown as Parameters<typeof updateAttempts>[0]
  await updateAttempts(counting, [{ id: rows[0]!.id, durationMs: 7 }], row(0).startedAtMs - 60_000)
  t.equal(statements.length, 1, 'a bound that holds: one statement')
  t.match(statements[0], /filed_at >=/, 'and it is the bounded one')
  // A bound past every row (as a caller with a wrong start would give): the rows are still found.
  statements.length = 0
  await updateAttempts(counting, [{ id: rows[0]!.id, error: 'late note' }], Date.now() + 3_600_000)
  t.equal(statements.length, 2, 'a bound that misses: the unbounded statement follows')
  await log.close()
  const listed = new Map((await listAttempts(broker.db.pool, groupId, { limit: 10 })).map((r) => [r.deliveryId, r]))
  for (const [i, r] of rows.entries()) t.match(listed.get(r.id), { outcome: 'acked', statusCode: 200 }, `row ${i}'s outcome written`)
  t.match(listed.get(rows[0]!.id), { error: 'late note', durationMs: 7 }, 'updates bounded around and past their row land')
})

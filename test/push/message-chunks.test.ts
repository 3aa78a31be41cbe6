// Messages in chunks (src/store/message-chunks.ts), as groups and readers see them: a group reads
// across a chunk boundary; a chunk past the retention goes whole and a seek into it starts at the
// oldest kept, and so does a group made then; rows no chunk covered are filed once into a chunk made for them (a topic's own
// default, and messages_default for a topic that had no tree); a topic created while the sweep
// runs keeps its messages; deleted topics' empty trees go in batches; and a read plans and locks its own topic's chunks only, however many
// topics there are. Rows are aged in the database, not waited for; the sweep is driven directly.
import t from '../helpers/tap.ts'
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { readForDispatch } from '../../src/store/consumption.ts'
import { maintainMessageChunks, maintainTopicChunks } from '../../src/store/message-chunks.ts'
import { firstOffsets, offsetsAtTime, readMessages } from '../../src/store/messages.ts'
import { partitionStarts } from '../../src/store/storage.ts'
import { api } from '../helpers/api.ts'
import { needsServer, testDatabase } from '../helpers/db.ts'
import { inOffsetOrder, startReceiver } from '../helpers/receiver.ts'
import { waitUntil } from '../helpers/wait.ts'

const db = await testDatabase(t)
const broker: Broker = await createBroker(
  loadConfig({
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
    LOG_LEVEL: 'silent',
    HOOKQ_ATTEMPT_RETENTION_MS: '60000',
  }),
)
t.teardown(() => broker.close())
const { call, produce, sql, groupStatus } = api(broker)
const topicId = async (name: string) => (await sql('SELECT id FROM topics WHERE name = $1', [name]))[0].id as number
/** Moves a topic's messages from `from` up to `to` (exclusive) `seconds` into the past. */
const age = (topic: string, from: number, to: number, seconds: number) =>
  sql(
    `UPDATE messages m SET produced_at = produced_at - $4 * interval '1 second' FROM topics t
     WHERE t.id = m.topic_id AND t.name = $1 AND m."offset" >= $2 AND m."offset" < $3`,
    [topic, from, to, seconds],
  )
/** Where each offset of the topic's partition 0 is stored (the table holding it), in offset order. */
const homes = async (topic: string) =>
  (
    await sql(
      `SELECT m."offset", m.tableoid::regclass::text AS home FROM messages m JOIN topics t ON t.id = m.topic_id
       WHERE t.name = $1 AND m.partition = 0 ORDER BY m."offset"`,
      [topic],
    )
  ).map((r) => r.home as string)
const committed = async (group: string) => (await groupStatus(group)).partitions[0].committedOffset as number
const offsets = (requests: { json: unknown }[]) => inOffsetOrder(requests as never).map((r) => (r.json as { offset: number }).offset)

t.test('a group reads across a chunk boundary; strays are filed into a chunk made for them, once', async (t) => {
  const receiver = await startReceiver(t)
  // Retention 10 min: spans of 150 s.
  await call('PUT', '/v1/topics/across', { partitions: 1, retentionMs: 600_000 })
  await call('PUT', '/v1/groups/across-g', { topic: 'across', ackMode: 'auto', paused: true })
  await call('POST', '/v1/groups/across-g/consumers', { url: receiver.url })
  await produce(
    'across',
    Array.from({ length: 10 }, (_, i) => ({ value: i })),
  )
  const id = await topicId('across')
  t.ok(
    (await homes('across')).every((h) => h.startsWith(`messages_t${id}_`) && !h.endsWith('_default')),
    'produced into a chunk',
  )

  // 0..4 five minutes back (within the retention, before every chunk): the topic's default holds
  // them until the sweep makes the chunk that covers them and moves them there.
  await age('across', 0, 5, 300)
  t.ok(
    (await homes('across')).slice(0, 5).every((h) => h === `messages_t${id}_default`),
    'no chunk covered them',
  )
  const first = await broker.retention.sweep()
  t.equal(first.filedMessages, 5, 'the strays filed')
  t.equal(first.messages, 0, 'none deleted')
  const filed = await homes('across')
  t.equal(new Set(filed.slice(0, 5)).size, 1)
  t.not(filed[0], filed[5], 'two chunks hold the partition')
  t.ok(filed.every((h) => !h.endsWith('_default')))
  const again = await broker.retention.sweep()
  t.equal(again.filedMessages, 0, 'nothing filed twice')
  t.same(await homes('across'), filed, 'every row where the first sweep put it')

  await call('PUT', '/v1/groups/across-g', { topic: 'across', ackMode: 'auto', paused: false })
  await waitUntil(async () => (await committed('across-g')) === 10, 30_000, 'all ten completed')
  t.same(offsets(receiver.requests), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 'read across the boundary in offset order')
})

t.test('a chunk past the retention goes whole; a group and a seek into it start at the oldest kept', async (t) => {
  const receiver = await startReceiver(t)
  await call('PUT', '/v1/topics/dropped', { partitions: 1, retentionMs: 600_000 })
  await call('PUT', '/v1/groups/dropped-g', { topic: 'dropped', ackMode: 'auto', paused: true })
  await call('POST', '/v1/groups/dropped-g/consumers', { url: receiver.url })
  await produce(
    'dropped',
    Array.from({ length: 10 }, (_, i) => ({ value: i })),
  )
  await age('dropped', 0, 6, 300)
  t.equal((await broker.retention.sweep()).filedMessages, 6, '0..5 in a chunk of their own')
  const chunkOf0 = (await homes('dropped'))[0]!

  // The retention cut to 60 s: the older chunk's end is past it, the current one's is not.
  await call('PUT', '/v1/topics/dropped', { partitions: 1, retentionMs: 60_000 })
  const swept = await broker.retention.sweep()
  t.equal(swept.messageChunks, 1, 'one chunk dropped')
  t.equal(swept.messages, 6, 'with its six messages')
  t.notOk((await sql('SELECT to_regclass($1) AS oid', [chunkOf0]))[0].oid, 'the chunk is gone')

  // A group made now, from the earliest or from a time before the dropped chunk, starts at the
  // oldest kept (firstOffsets and offsetsAtTime: a probe of each chunk's key, not a scan).
  await call('PUT', '/v1/groups/dropped-early', { topic: 'dropped', ackMode: 'auto', paused: true })
  t.equal(await committed('dropped-early'), 6, 'a group made at earliest starts at the oldest kept')
  const anHourAgo = new Date(Date.now() - 3_600_000).toISOString()
  await call('PUT', '/v1/groups/dropped-timed', { topic: 'dropped', ackMode: 'auto', paused: true, startAt: anHourAgo })
  t.equal(await committed('dropped-timed'), 6, 'and one made from a time before the dropped chunk')

  await call('PUT', '/v1/groups/dropped-g', { topic: 'dropped', ackMode: 'auto', paused: false })
  await waitUntil(async () => (await committed('dropped-g')) === 10, 30_000, 'committed past the dropped range')
  t.same(offsets(receiver.requests), [6, 7, 8, 9], 'only kept messages pushed')
  const page = (await call('GET', '/v1/topics/dropped/partitions/0/messages?fromOffset=2&limit=2')).json
  t.same(
    page.messages.map((m: { offset: number }) => m.offset),
    [6, 7],
    'a fetch from the dropped range starts at the oldest kept',
  )
  const before = receiver.requests.length
  t.equal((await call('POST', '/v1/groups/dropped-g/seek', { partition: 0, offset: 3 })).status, 200)
  await waitUntil(async () => receiver.requests.length === before + 4, 30_000, 'the kept messages pushed again')
  t.same(offsets(receiver.requests.slice(before)), [6, 7, 8, 9], 'the seek starts at the oldest kept')
})

// The next tests hold a session (a writer, a reader, a lock) while the sweep or a produce runs in
// another: the embedded database serves one session at a time.
t.test(
  'a produce into the default committing while strays are filed is filed too, not a failed sweep',
  { skip: needsServer },
  async (t) => {
    await call('PUT', '/v1/topics/filing', { partitions: 1, retentionMs: 600_000 })
    await produce(
      'filing',
      Array.from({ length: 3 }, (_, i) => ({ value: i })),
    )
    const id = await topicId('filing')
    await age('filing', 0, 2, 300)
    // A writer into the topic's default (a row no chunk covers), not committed yet when the sweep starts.
    const writer = await broker.db.pool.connect()
    t.teardown(() => writer.release())
    await writer.query('BEGIN')
    await writer.query(
      `INSERT INTO messages (topic_id, partition, "offset", value, produced_at) VALUES ($1, 0, 100, '"late"', now() - interval '290 seconds')`,
      [id],
    )
    const sweeping = maintainTopicChunks(broker.db.pool, id, { sweepIntervalMs: 60_000, wait: true, lockTimeoutMs: 60_000 })
    await waitUntil(
      async () => (await sql(`SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'relation'`)).length > 0,
      30_000,
      'the sweep waits for the writer',
    )
    await writer.query('COMMIT')
    const done = await sweeping
    t.equal(done.filedRows, 3, 'the committed row filed with the others')
    t.same(await homes('filing').then((h) => h.filter((x) => x.endsWith('_default'))), [], 'none left in the default')
    t.equal((await sql(`SELECT count(*)::int AS n FROM messages WHERE topic_id = $1`, [id]))[0].n, 4)
  },
)

t.test(
  'a produce routed to the default while a chunk is attached is run again into the chunk (23514)',
  { skip: needsServer },
  async (t) => {
    await call('PUT', '/v1/topics/rerouted', { partitions: 1, retentionMs: 600_000 })
    const id = await topicId('rerouted')
    // No chunk covers now (as when the sweep stopped for long): produce goes to the topic's default.
    for (const { name } of await sql(
      `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass AND c.relname !~ '_default$'`,
      [`messages_t${id}`],
    )) {
      await sql(`ALTER TABLE "messages_t${id}" DETACH PARTITION "${name}"`)
      await sql(`DROP TABLE "${name}"`)
    }
    // The sweep's first transaction: the default locked, then the chunk for now attached.
    const sweep = await broker.db.pool.connect()
    t.teardown(() => sweep.release())
    await sweep.query('BEGIN')
    await sweep.query(`LOCK TABLE "messages_t${id}_default" IN SHARE ROW EXCLUSIVE MODE`)
    const producing = produce('rerouted', [{ value: 'routed' }])
    await waitUntil(
      async () =>
        (await sql(`SELECT 1 FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, [`messages_t${id}_default`])).length > 0,
      30_000,
      'the produce waits for the default',
    )
    const from = Date.now() - 3_600_000
    const to = Date.now() + 3_600_000
    const chunk = `messages_t${id}_${from}_${to}`
    await sweep.query(`CREATE TABLE "${chunk}" (LIKE messages INCLUDING DEFAULTS)`)
    await sweep.query(
      `ALTER TABLE "messages_t${id}" ATTACH PARTITION "${chunk}" FOR VALUES FROM ('${new Date(from).toISOString()}') TO ('${new Date(to).toISOString()}')`,
    )
    await sweep.query('COMMIT')
    const res = await producing
    t.equal(res.status, 201, 'produced: the statement that failed on the new bound was run again')
    t.same(await homes('rerouted'), [chunk], 'into the chunk')
  },
)

t.test('chunks past the retention are dropped even when making chunks failed', { skip: needsServer }, async (t) => {
  await call('PUT', '/v1/topics/stuck', { partitions: 1, retentionMs: 600_000 })
  await produce(
    'stuck',
    Array.from({ length: 6 }, (_, i) => ({ value: i })),
  )
  const id = await topicId('stuck')
  // Spans of 150 s: 0..2 filed into a chunk ending 440 s back or earlier.
  await age('stuck', 0, 3, 590)
  t.equal((await maintainTopicChunks(broker.db.pool, id, { sweepIntervalMs: 60_000, wait: true })).filedRows, 3)
  const old = (await homes('stuck'))[0]!
  await call('PUT', '/v1/topics/stuck', { partitions: 1, retentionMs: 400_000 })
  // A stray within the new retention, between that chunk and those made when the topic was (150 s
  // back at most), and a reader holding one of those: filing it needs the whole tree and times out.
  await age('stuck', 5, 6, 300)
  const newest = (
    await sql(
      `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
       WHERE i.inhparent = $1::regclass AND c.relname !~ '_default$' AND c.relname <> $2 LIMIT 1`,
      [`messages_t${id}`, old],
    )
  )[0].name as string
  const reader = await broker.db.pool.connect()
  t.teardown(() => reader.release())
  await reader.query('BEGIN')
  await reader.query(`SELECT 1 FROM "${newest}" LIMIT 1`)
  const result = maintainTopicChunks(broker.db.pool, id, { sweepIntervalMs: 60_000, wait: true, lockTimeoutMs: 200 })
  await t.rejects(result, { code: '55P03' }, 'making the chunk for the stray timed out')
  await reader.query('ROLLBACK')
  t.notOk((await sql('SELECT to_regclass($1) AS oid', [old]))[0].oid, 'the chunk past the retention went all the same')
  t.same(
    (await sql(`SELECT "offset"::int AS o FROM messages WHERE topic_id = $1 ORDER BY 1`, [id])).map((r) => r.o),
    [3, 4, 5],
  )
  t.equal(
    (await maintainTopicChunks(broker.db.pool, id, { sweepIntervalMs: 60_000, wait: true })).filedRows,
    1,
    'the stray filed next time',
  )
})

t.test('a topic created while a sweep runs keeps its messages', { skip: needsServer }, async (t) => {
  // The worst order: the topic's maintenance runs while its row is written but not committed, so
  // the topic looks deleted to it. Nothing of the topic exists yet to drop; its rows go to
  // messages_default, and the next maintenance makes its tree and files them there.
  const creator = await broker.db.pool.connect()
  t.teardown(() => creator.release())
  await creator.query('BEGIN')
  const [{ id }] = (await creator.query(`INSERT INTO topics (name, partitions, retention_ms) VALUES ('racing', 1, 600000) RETURNING id`))
    .rows
  await creator.query(`INSERT INTO topic_partitions (topic_id, partition, next_offset) VALUES ($1, 0, 0)`, [id])
  const during = await maintainTopicChunks(broker.db.pool, id, { sweepIntervalMs: 60_000, wait: true })
  t.same(during.dropped, [], 'nothing dropped')
  await creator.query('COMMIT')
  await produce(
    'racing',
    Array.from({ length: 4 }, (_, i) => ({ value: i })),
  )
  t.same(new Set(await homes('racing')), new Set(['messages_default']), 'its rows wait in messages_default')
  const swept = await broker.retention.sweep()
  t.equal(swept.filedMessages, 4, 'filed into its new tree')
  t.ok((await homes('racing')).every((h) => h.startsWith(`messages_t${id}_`) && !h.endsWith('_default')))
  t.equal((await broker.retention.sweep()).filedMessages, 0, 'once')

  // Sweepers racing topic creation: every topic made meanwhile keeps every message it acknowledged.
  let sweeping = true
  const sweeps = [0, 1, 2].map(async () => {
    while (sweeping) await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true })
  })
  for (let i = 0; i < 12; i++) {
    t.equal((await call('PUT', `/v1/topics/born-${i}`, { partitions: 2, retentionMs: 600_000 })).status, 201)
    await produce(
      `born-${i}`,
      Array.from({ length: 5 }, (_, j) => ({ value: j, partition: j % 2 })),
    )
  }
  sweeping = false
  await Promise.all(sweeps)
  await broker.retention.sweep()
  for (let i = 0; i < 12; i++) {
    const parts = (await call('GET', `/v1/topics/born-${i}`)).json.partitionStats as { startOffset: number; endOffset: number }[]
    t.same(
      parts.map((p) => [p.startOffset, p.endOffset]),
      [
        [0, 3],
        [0, 2],
      ],
      `born-${i} keeps its five messages`,
    )
  }
})

t.test(
  'a deleted topic’s chunks go at the next sweep, with no lock on messages that produce waits for',
  { skip: needsServer },
  async (t) => {
    await call('PUT', '/v1/topics/doomed', { partitions: 2, retentionMs: 600_000 })
    await call('PUT', '/v1/topics/bystander', { partitions: 1, retentionMs: 600_000 })
    await produce(
      'doomed',
      Array.from({ length: 6 }, (_, i) => ({ value: i, partition: i % 2 })),
    )
    await produce('bystander', [{ value: 'kept' }])
    const id = await topicId('doomed')
    const bystander = await topicId('bystander')
    t.equal((await call('DELETE', '/v1/topics/doomed')).status, 204)
    // Not deleted row by row in the delete's transaction: the sweep drops them whole.
    t.equal((await sql(`SELECT count(*)::int AS n FROM messages WHERE topic_id = $1`, [id]))[0].n, 6, 'its rows stay until the sweep')
    t.equal((await call('GET', '/v1/topics/doomed/partitions/0/messages?fromOffset=0')).status, 404, 'but nothing reads them')
    const trees = async () =>
      (
        await sql(`SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'messages'::regclass`)
      ).map((r) => r.name as string)
    const chunks = async () =>
      (await sql(`SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ $1`, [`^messages_t${id}_[0-9]+_[0-9]+$`])).length
    t.ok((await trees()).includes(`messages_t${id}`), 'its tree stays until the sweep')
    t.ok((await chunks()) > 0)

    // What every produce holds on messages while it inserts: the sweep must not need more than that.
    const producer = await broker.db.pool.connect()
    try {
      await producer.query('BEGIN')
      await producer.query('LOCK TABLE ONLY messages IN ROW EXCLUSIVE MODE')
      const swept = await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true, lockTimeoutMs: 2000 })
      t.same(swept.failed, [], 'not held up by a produce in progress')
      t.ok(swept.dropped.includes(`messages_t${id}`))
    } finally {
      await producer.query('ROLLBACK')
      producer.release()
    }
    t.equal(await chunks(), 0, 'its chunks are gone')
    t.notOk((await trees()).includes(`messages_t${id}`), 'its tree is no longer swept')
    t.ok((await trees()).includes(`messages_gone_t${id}`), 'an empty shell stays attached (detaching it would lock messages)')
    t.equal((await sql(`SELECT count(*)::int AS n FROM messages WHERE topic_id = $1`, [id]))[0].n, 0)
    t.ok((await trees()).includes(`messages_t${bystander}`))
    t.same(
      (await call('GET', '/v1/topics/bystander/partitions/0/messages?fromOffset=0')).json.messages.map((m: { value: unknown }) => m.value),
      ['kept'],
    )
    t.same((await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true })).dropped, [], 'once')
  },
)

t.test(
  'deleted topics’ empty trees are detached and dropped in a batch, once no produce holds messages',
  { skip: needsServer },
  async (t) => {
    const trees = async () =>
      (
        await sql(`SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'messages'::regclass`)
      ).map((r) => r.name as string)
    const gone = async () => (await trees()).filter((name) => name.startsWith('messages_gone_t')).sort()
    const ids: number[] = []
    for (let i = 0; i < 3; i++) {
      await call('PUT', `/v1/topics/churn-${i}`, { partitions: 1, retentionMs: 600_000 })
      await produce(`churn-${i}`, [{ value: i }])
      ids.push(await topicId(`churn-${i}`))
      t.equal((await call('DELETE', `/v1/topics/churn-${i}`)).status, 204)
    }
    await call('PUT', '/v1/topics/churn-stays', { partitions: 1, retentionMs: 600_000 })
    await produce('churn-stays', [{ value: 'kept' }])
    const before = await gone()
    // Fewer than a batch: they stay (each a lock on messages of its own is what batching avoids).
    const few = await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true, goneTreesBatch: before.length + 4 })
    t.same(few.failed, [])
    const shells = await gone()
    t.ok(
      ids.every((id) => shells.includes(`messages_gone_t${id}`)),
      'the deleted topics are empty shells, still attached',
    )

    // A batch, but a produce holds messages (ROW EXCLUSIVE): the lock is waited for briefly, not had.
    const producer = await broker.db.pool.connect()
    try {
      await producer.query('BEGIN')
      await producer.query('LOCK TABLE ONLY messages IN ROW EXCLUSIVE MODE')
      const held = await maintainMessageChunks(broker.db.pool, {
        sweepIntervalMs: 60_000,
        wait: true,
        goneTreesBatch: 3,
        lockTimeoutMs: 50,
        lockAttempts: 2,
      })
      t.match(
        held.failed.map((f) => (f.err as { code?: string }).code),
        ['55P03'],
        'the lock on messages not had in time: given up',
      )
      t.same(await gone(), shells, 'nothing detached')
    } finally {
      await producer.query('ROLLBACK')
      producer.release()
    }

    // A batch a lock, at most: with one shell more than a batch, that one stays for a later sweep.
    const capped = await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true, goneTreesBatch: shells.length - 1 })
    t.same(capped.failed, [])
    t.equal(capped.dropped.filter((name) => name.startsWith('messages_gone_t')).length, shells.length - 1, 'a batch detached and dropped')
    t.same(await gone(), shells.slice(-1), 'one left attached')
    // A shell detached but not dropped (a process stopped between the two) is dropped by the next sweep.
    await sql(`ALTER TABLE messages DETACH PARTITION "${shells.at(-1)}"`)
    const swept = await maintainMessageChunks(broker.db.pool, { sweepIntervalMs: 60_000, wait: true })
    t.same(swept.failed, [])
    t.same(
      swept.dropped.filter((name) => name.startsWith('messages_gone_t')),
      [shells.at(-1)],
      'the one left detached is dropped',
    )
    t.same(await gone(), [], 'none left attached')
    t.same(
      (await sql(`SELECT relname FROM pg_class WHERE relname ~ '^messages_gone_t'`)).map((r) => r.relname),
      [],
      'and dropped, their defaults with them',
    )
    await produce('churn-stays', [{ value: 'after' }])
    t.same(
      (await call('GET', '/v1/topics/churn-stays/partitions/0/messages?fromOffset=0')).json.messages.map(
        (m: { value: unknown }) => m.value,
      ),
      ['kept', 'after'],
      'other topics read and produce as before',
    )
  },
)

t.test('a read plans and locks its own topic’s chunks only, however many topics there are', async (t) => {
  // Topic ids are read before a session is held: the embedded database serves one at a time.
  let lock0 = 0
  const relationLocks = async (read: (q: import('pg').PoolClient) => Promise<unknown>) => {
    const client = await broker.db.pool.connect()
    try {
      await client.query('BEGIN')
      await read(client)
      const { rows } = await client.query(
        `SELECT count(*)::int AS n, count(*) FILTER (WHERE c.relname ~ '^messages_t[0-9]+' AND c.relname !~ $1)::int AS others,
                count(*) FILTER (WHERE c.relname ~ $1)::int AS mine
         FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation
         WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'`,
        [`^messages_t${lock0}(_|$)`],
      )
      await client.query('ROLLBACK')
      return rows[0] as { n: number; others: number; mine: number }
    } finally {
      client.release()
    }
  }
  const reads = async (q: import('pg').PoolClient) => {
    const id = lock0
    await readForDispatch(q, [{ topicId: id, partition: 0, fromOffset: 0 }], 10)
    await readMessages(q, id, 0, 0, 10)
    await partitionStarts(q, id)
    await firstOffsets(q, id)
    await offsetsAtTime(q, id, new Date(0))
  }
  await call('PUT', '/v1/topics/lock-0', { partitions: 1, retentionMs: 600_000 })
  await produce('lock-0', [{ value: 0 }])
  lock0 = await topicId('lock-0')
  const alone = await relationLocks(reads)
  for (let i = 1; i <= 40; i++) {
    await call('PUT', `/v1/topics/lock-${i}`, { partitions: 1, retentionMs: 600_000 })
    await produce(`lock-${i}`, [{ value: i }])
  }
  const chunks = Number((await sql(`SELECT count(*) AS n FROM pg_class WHERE relname ~ '^messages_t[0-9]+_[0-9]+_[0-9]+$'`))[0].n)
  t.ok(chunks > 80, `many chunks (${chunks})`)
  const among = await relationLocks(reads)
  t.equal(among.others, 0, 'no other topic’s chunk locked')
  // Its own chunks are a few (a span may have begun meanwhile); every other lock is the same.
  t.equal(among.n - among.mine, alone.n - alone.mine, `as many other locks among 41 topics as alone (${alone.n - alone.mine})`)
  t.ok(among.mine <= alone.mine + 6, `its own tree's (${alone.mine}, then ${among.mine})`)

  // What a statement planned without the topic id's value holds (a generic plan: a named statement
  // reused, or Prisma's): every topic's chunks, which is what the reads above must never be.
  const generic = await relationLocks(async (q) => {
    await q.query('SET LOCAL plan_cache_mode = force_generic_plan')
    await q.query(`PREPARE generic_read(int) AS SELECT * FROM messages WHERE topic_id = $1 AND partition = 0 ORDER BY "offset" LIMIT 10`)
    await q.query(`EXECUTE generic_read(${lock0})`)
  })
  t.ok(generic.others > 40 * 2, `a generic plan locks the other topics' too (${generic.others})`)
  t.comment(`relation locks: alone ${alone.n}, among 41 topics ${among.n}, a generic plan among them ${generic.n}`)

  // The plan names the topic's chunks only: pruned when planned, not at run time.
  const id = await topicId('lock-7')
  const plan = (
    await sql(`EXPLAIN SELECT * FROM messages WHERE topic_id = $1 AND partition = 0 AND "offset" >= 0 ORDER BY "offset" LIMIT 10`, [id])
  )
    .map((r) => r['QUERY PLAN'] as string)
    .join('\n')
  const named = [...plan.matchAll(/on (messages_t\d+)_/g)].map((m) => m[1])
  t.ok(named.length > 0)
  t.ok(
    named.every((n) => n === `messages_t${id}`),
    'only its chunks in the plan',
  )
  t.notMatch(plan, /Subplans Removed/, 'nothing left to prune at run time')

  // A dispatch read of several topics at once: still each topic's chunks alone per statement.
  const ids = await Promise.all([0, 1, 2, 3].map((i) => topicId(`lock-${i}`)))
  const rows = await readForDispatch(
    broker.db.pool,
    ids.map((id) => ({ topicId: id, partition: 0, fromOffset: 0 })),
    10,
  )
  t.same(
    rows.map((r) => r.map((m) => m.value)),
    [['0'], ['1'], ['2'], ['3']],
    'each topic’s messages, in request order',
  )
})

/**
 * What trace context costs a message (`node --import tsx bench/trace-cost.ts [<other checkout>]`),
 * measured in one process in alternating rounds (the shared machine drifts too much for two
 * bench:e2e runs to resolve a few percent; see docs/performance.md "Trace context"):
 *
 *   produce  the broker's JS per produced message: messageTrace() without and with a traceparent
 *   push     buildPush() per attempt, this checkout's against the other checkout's (without trace context)
 *   append   the APPEND statement, 100 messages a call on one connection, wall time per message:
 *            no traceparent, a traceparent on every message, and the other checkout's statement
 *            on a database migrated by its own migrations
 *
 * Without another checkout only the first column of each is measured. Bounded: ROUNDS rounds.
 */
import { execFileSync } from 'node:child_process'
import { pathToFileURL } from 'node:url'
import { join, resolve } from 'node:path'
import { buildPush } from '../src/dispatch/envelope.ts'
import { messageTrace, type MessageTrace } from '../src/dispatch/trace-context.ts'
import { applyMigrations } from '../src/store/migrate.ts'
import { openDatabase } from '../src/store/db.ts'
import { appendRows, type AppendEntry } from '../src/store/messages.ts'
import { createBenchDatabase } from './lib/db.ts'

const BASE = process.argv[2] ? resolve(process.argv[2]) : undefined
const ROUNDS = 7
const SERVER = process.env.BENCH_DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** CPU ns per call of fn over n calls. */
function cpuNs(n: number, fn: (i: number) => void): number {
  const start = process.cpuUsage()
  for (let i = 0; i < n; i++) fn(i)
  const used = process.cpuUsage(start)
  return ((used.user + used.system) * 1000) / n
}

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
const into: MessageTrace = { traceId: '', traceparent: null, tracestate: null }
const withHeader = { traceparent: TP }
const produce = { none: [] as number[], traceparent: [] as number[] }
const push = { this: [] as number[], base: [] as number[] }
const target = { groupName: 'g', topicName: 'orders', topicId: 3, partition: 2, pushFormat: 'envelope' as const, consumerSecrets: [] }
const msg = {
  offset: 41,
  key: null,
  value: '{"order":42,"total":9.99}',
  headers: '{}',
  producedAtMs: Date.now(),
  availableAtMs: 0,
  traceId: TP.slice(3, 35),
  traceparent: null,
  tracestate: null,
}
const baseEnvelope = BASE
  ? ((await import(pathToFileURL(join(BASE, 'src/dispatch/envelope.ts')).href)) as { buildPush: typeof buildPush })
  : undefined
for (let r = 0; r < ROUNDS; r++) {
  produce.none.push(cpuNs(300_000, () => messageTrace(undefined, null, into)))
  produce.traceparent.push(cpuNs(300_000, () => messageTrace(withHeader, null, into)))
  push.this.push(cpuNs(200_000, (i) => buildPush(target, msg, 'AAAAAQAAAAAAAAAAAAAAAAAAAAHk7D0iQ3K7l0xBfS2n1sgh', 1, 1e12 + i, 1e12 + i)))
  if (baseEnvelope)
    push.base.push(
      cpuNs(200_000, (i) => baseEnvelope.buildPush(target, msg, 'AAAAAQAAAAAAAAAAAAAAAAAAAAHk7D0iQ3K7l0xBfS2n1sgh', 1, 1e12 + i, 1e12 + i)),
    )
}
console.log(
  `produce JS per message: no traceparent ${median(produce.none).toFixed(0)} ns, a traceparent ${median(produce.traceparent).toFixed(0)} ns`,
)
console.log(
  `buildPush per attempt: this ${median(push.this).toFixed(0)} ns${BASE ? `, other checkout ${median(push.base).toFixed(0)} ns` : ''}`,
)

// ---- the APPEND statement
const PER_CALL = 100
const CALLS = 60
async function appendSide(root: string | undefined) {
  const db = await createBenchDatabase(SERVER)
  if (root) {
    // In a process of its own: two copies of the schema engine's WebAssembly in one process clash.
    const script = `import { applyMigrations } from ${JSON.stringify(pathToFileURL(join(root, 'src/store/migrate.ts')).href)}; await applyMigrations(${JSON.stringify(db.url)})`
    execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: 'inherit', timeout: 120_000 })
  } else {
    await applyMigrations(db.url)
  }
  const store = root
    ? ((await import(pathToFileURL(join(root, 'src/store/messages.ts')).href)) as { appendRows: typeof appendRows })
    : { appendRows }
  const pool = openDatabase(db.url, 1)
  await pool.pool.query(`INSERT INTO topics (name, partitions, retention_ms) VALUES ('t', 8, 604800000)`)
  const topicId = (await pool.pool.query<{ id: number }>(`SELECT id FROM topics`)).rows[0]!.id
  await pool.pool.query(`INSERT INTO topic_partitions (topic_id, partition, next_offset) SELECT $1, p, 0 FROM generate_series(0, 7) p`, [
    topicId,
  ])
  return { db, pool, topicId, append: store.appendRows }
}
const sides = {
  none: await appendSide(undefined),
  traceparent: await appendSide(undefined),
  ...(BASE ? { base: await appendSide(BASE) } : {}),
}
const times: Record<string, number[]> = { none: [], traceparent: [], base: [] }
const entries = (topicId: number, traced: boolean): AppendEntry[] =>
  Array.from({ length: PER_CALL }, (_, i) => {
    messageTrace(traced ? withHeader : undefined, null, into)
    return {
      topicId,
      partition: i % 8,
      key: null,
      value: msg.value,
      headers: traced ? JSON.stringify(withHeader) : '{}',
      delayMs: 0,
      idempotencyKey: null,
      ...into,
    }
  })
try {
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, side] of Object.entries(sides)) {
      const start = performance.now()
      for (let c = 0; c < CALLS; c++) await side.append(side.pool.pool, entries(side.topicId, name === 'traceparent'))
      times[name]!.push(((performance.now() - start) * 1000) / (CALLS * PER_CALL))
    }
  }
  console.log(
    `APPEND wall time per message (one connection): no traceparent ${median(times.none!).toFixed(1)} us, a traceparent ${median(times.traceparent!).toFixed(1)} us` +
      (BASE ? `, other checkout ${median(times.base!).toFixed(1)} us` : ''),
  )
} finally {
  for (const side of Object.values(sides)) {
    await side.pool.close()
    await side.db.drop()
  }
}

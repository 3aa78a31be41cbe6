/**
 * The webhook receiver of the end-to-end scenarios, in its own process: node:http on 127.0.0.1, answers 200 as
 * soon as a push's body has arrived, then counts it (unique and duplicate partition/offset pairs),
 * records when it arrived, and the produce-to-push latency from the send time the producer put in
 * the message value (`value.t`, wall-clock ms; `value.w` set = warm-up, not counted).
 *
 * Mode `ack` behaves like a consumer library in explicit mode: delivery ids are batched and sent
 * to POST /v1/groups/{g}/acks when 500 have gathered or 5 ms after the first one, with at most 4 ack
 * calls at once; a failed call is sent again (3 attempts).
 *
 * Driven over IPC (bench/lib/ipc.ts): `scenario` starts counting pushes to /p/<name> (anything else
 * is a stray: a late push of an earlier scenario), `expect` sets how many unique messages make the
 * scenario complete (then the `done` event fires once, acks included), `stats` reports.
 *
 * argv[2]: JSON { brokerUrl }
 */
import { createServer } from 'node:http'
import { Pool } from 'undici'
import { emitEvent, serveIpc } from './lib/ipc.ts'
import { Latencies } from './lib/stats.ts'

const args = JSON.parse(process.argv[2] ?? '{}') as { brokerUrl: string }
const wallNow = () => performance.timeOrigin + performance.now()
const ACK_BATCH = 500
const ACK_FLUSH_MS = 5
const ACK_CONCURRENCY = 4

interface ScenarioConfig {
  name: string
  mode: 'count' | 'ack'
  /** Unique messages that complete the scenario; 0 = not known yet (see `expect`). */
  expect: number
  group?: string
}

/** Partition/offset pairs seen: one byte per offset, grown by doubling. */
class Seen {
  private parts = new Map<number, Uint8Array>()
  /** True the first time (partition, offset) is marked. */
  mark(partition: number, offset: number): boolean {
    let a = this.parts.get(partition)
    if (a === undefined || offset >= a.length) {
      let size = a?.length ?? 1024
      while (size <= offset) size *= 2
      const bigger = new Uint8Array(size)
      if (a) bigger.set(a)
      this.parts.set(partition, bigger)
      a = bigger
    }
    if (a[offset] === 1) return false
    a[offset] = 1
    return true
  }
}

class Scenario {
  pushes = 0
  unique = 0
  duplicates = 0
  badBodies = 0
  lastUniqueAt = NaN
  readonly seen = new Seen()
  readonly latency = new Latencies()
  // explicit acks
  pending: string[] = []
  timer: NodeJS.Timeout | undefined
  ackInFlight = 0
  ackRetrying = 0
  ackCalls = 0
  ackErrors = 0
  readonly ackStatuses: Record<string, number> = {}
  doneAt = NaN
  constructor(readonly cfg: Required<ScenarioConfig>) {}
}

let current: Scenario | undefined
const pool = new Pool(args.brokerUrl, { connections: 8, pipelining: 1 })

const server = createServer((req, res) => {
  const chunks: Buffer[] = []
  req.on('data', (c: Buffer) => chunks.push(c))
  req.on('end', () => {
    const at = wallNow()
    res.writeHead(200, { 'content-length': '0' })
    res.end()
    onPush(req.url ?? '', chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks), at)
  })
})
server.keepAliveTimeout = 30_000 // longer than the broker's 4 s idle close: the broker closes first
server.headersTimeout = 60_000

interface Envelope {
  deliveryId?: string
  partition?: number
  offset?: number
  value?: { t?: number; w?: number }
}

function onPush(url: string, body: Buffer, at: number): void {
  const s = current
  const q = url.indexOf('?')
  const path = q < 0 ? url : url.slice(0, q)
  if (s === undefined || path !== `/p/${s.cfg.name}`) return // a late push of an earlier scenario
  let parsed: Envelope & { deliveries?: Envelope[] }
  try {
    parsed = JSON.parse(body.toString('utf8')) as Envelope & { deliveries?: Envelope[] }
  } catch {
    s.badBodies++
    return
  }
  s.pushes++
  // A batch push carries its envelopes in `deliveries`: each counts as a message received.
  for (const env of parsed.deliveries ?? [parsed]) onMessage(s, env, at)
  checkDone(s)
}

function onMessage(s: Scenario, env: Envelope, at: number): void {
  if (typeof env.partition !== 'number' || typeof env.offset !== 'number') {
    s.badBodies++
    return
  }
  if (s.seen.mark(env.partition, env.offset)) {
    s.unique++
    s.lastUniqueAt = at
    const v = env.value
    if (v && typeof v.t === 'number' && !v.w) {
      s.latency.add(at - v.t)
    }
  } else {
    s.duplicates++
  }
  if (s.cfg.mode === 'ack' && typeof env.deliveryId === 'string') {
    s.pending.push(env.deliveryId)
    scheduleFlush(s)
  }
}

function scheduleFlush(s: Scenario): void {
  if (s.pending.length >= ACK_BATCH) {
    flush(s)
    return
  }
  if (s.timer === undefined && s.pending.length > 0) {
    s.timer = setTimeout(() => {
      s.timer = undefined
      flush(s)
    }, ACK_FLUSH_MS)
  }
}

function flush(s: Scenario): void {
  if (s.timer !== undefined) {
    clearTimeout(s.timer)
    s.timer = undefined
  }
  while (s.pending.length > 0 && s.ackInFlight < ACK_CONCURRENCY) {
    void sendAcks(s, s.pending.splice(0, ACK_BATCH), 1)
  }
}

async function sendAcks(s: Scenario, ids: string[], attempt: number): Promise<void> {
  s.ackInFlight++
  s.ackCalls++
  let failed = false
  try {
    const res = await pool.request({
      path: `/v1/groups/${encodeURIComponent(s.cfg.group)}/acks`,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ deliveryIds: ids }),
    })
    const text = await res.body.text()
    if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`)
    const { results } = JSON.parse(text) as { results: { status: string }[] }
    for (const r of results) s.ackStatuses[r.status] = (s.ackStatuses[r.status] ?? 0) + 1
  } catch (err) {
    failed = true
    s.ackErrors++
    if (s.ackErrors <= 3) console.error(`e2e-receiver: ack call failed (attempt ${attempt}):`, err instanceof Error ? err.message : err)
  } finally {
    s.ackInFlight--
  }
  if (failed && attempt < 3) {
    s.ackRetrying++
    setTimeout(() => {
      s.ackRetrying--
      void sendAcks(s, ids, attempt + 1)
    }, 100)
  }
  scheduleFlush(s)
  checkDone(s)
}

function checkDone(s: Scenario): void {
  if (!Number.isNaN(s.doneAt) || s.cfg.expect <= 0 || s.unique < s.cfg.expect) return
  if (s.cfg.mode === 'ack' && (s.pending.length > 0 || s.ackInFlight > 0 || s.ackRetrying > 0)) return
  s.doneAt = wallNow()
  emitEvent('done', { name: s.cfg.name, at: s.doneAt })
}

function stats(s: Scenario) {
  return {
    name: s.cfg.name,
    pushes: s.pushes,
    unique: s.unique,
    duplicates: s.duplicates,
    badBodies: s.badBodies,
    lastUniqueAt: s.lastUniqueAt,
    doneAt: s.doneAt,
    latencyMs: s.latency.summary(),
    acks: s.cfg.mode === 'ack' ? { calls: s.ackCalls, errors: s.ackErrors, statuses: s.ackStatuses } : undefined,
  }
}
export type ReceiverStats = ReturnType<typeof stats>

await new Promise<void>((resolve, reject) => server.listen(0, '127.0.0.1', resolve).once('error', reject))
const { port } = server.address() as { port: number }

serveIpc(
  {
    scenario(cfg: ScenarioConfig) {
      if (current?.timer !== undefined) clearTimeout(current.timer)
      current = new Scenario({ group: '', ...cfg })
      return { ok: true }
    },
    expect({ n }: { n: number }) {
      if (!current) throw new Error('no scenario')
      current.cfg.expect = n
      checkDone(current)
      return { unique: current.unique }
    },
    stats() {
      if (!current) throw new Error('no scenario')
      return stats(current)
    },
  },
  { port },
)

process.on('SIGTERM', () => {
  server.close()
  void pool.close()
  process.exit(0)
})

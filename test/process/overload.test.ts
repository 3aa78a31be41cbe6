/**
 * Produce far past capacity, against the real broker process: it sheds instead of queueing.
 *
 * Three clients with their own API keys, for a bounded time:
 * - bulk: 8 connections of 1000-message calls that retry at once, ignoring Retry-After (the worst
 *   kind of client); the commit backlog is capped at 1,000 messages, so it must get 503s;
 * - greedy: 24 connections of 1-message calls against a rate limit of 20 calls/s per key: 429;
 * - polite: 1-message calls 10 times a second, under its own limit: never rate-limited for
 *   someone else's load (it may meet a full backlog: 503 is the broker's overall answer).
 * Each client has its own connections, as separate clients would.
 *
 * Then: every refusal is a 429 or 503 with Retry-After and nothing else goes wrong; offered load
 * was several times what was accepted; every accepted message is stored once with its value at
 * the coordinates it was given, and nothing refused is stored; the broker's memory stayed near
 * its idle size; accepted calls were answered in bounded time (p99 printed, bound generous).
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { Pool } from 'undici'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { spawnBroker } from '../helpers/process.ts'

const KEYS = {
  bulk: 'bulk-key-0123456789abcdef',
  greedy: 'greedy-key-0123456789abcdef',
  polite: 'polite-key-0123456789abcdef',
  admin: 'admin-key-0123456789abcdef',
}
const LOAD_MS = 6000
const MAX_CALLS_PER_LOOP = 20_000 // a bound on each loop besides the clock
/** The commit backlog the broker accepts before it sheds with 503 (messages). */
const BACKLOG = 1000

async function childDatabaseEnv(t: Test): Promise<Record<string, string>> {
  if (databaseServerUrl) return { DATABASE_URL: (await testDatabase(t)).url }
  const dataDir = await mkdtemp(join(tmpdir(), 'hookq-embedded-'))
  t.teardown(() => rm(dataDir, { recursive: true, force: true }))
  return { HOOKQ_DATA_DIR: dataDir }
}

async function rssBytes(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8')
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)![1]) * 1024
}

interface Answer {
  client: string
  status: number
  retryAfter: string | undefined
  code?: string
  ms: number
  values: string[]
  results?: { partition: number; offset: number }[]
}

t.test('produce at several times capacity is shed with 429/503 and Retry-After; what is accepted keeps every guarantee', async (t) => {
  const env = await childDatabaseEnv(t)
  const broker = await spawnBroker({
    ...env,
    HOOKQ_API_KEYS: `${KEYS.bulk}:produce,${KEYS.greedy}:produce,${KEYS.polite}:produce,${KEYS.admin}:admin`,
    HOOKQ_RATE_LIMIT_PER_KEY: '20',
    HOOKQ_COMMIT_MAX_PENDING_MESSAGES: String(BACKLOG),
  })
  t.teardown(() => {
    broker.child.kill('SIGKILL')
  })
  const pools = new Map<string, Pool>()
  t.teardown(() => Promise.all([...pools.values()].map((p) => p.destroy())))

  const send = async (key: string, method: 'PUT' | 'POST' | 'GET', path: string, body?: unknown) => {
    let pool = pools.get(key)
    if (!pool) pools.set(key, (pool = new Pool(broker.url, { connections: 32 })))
    const res = await pool.request({
      method,
      path,
      headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
      headersTimeout: 30_000,
      bodyTimeout: 30_000,
    })
    const text = await res.body.text()
    const retryAfter = res.headers['retry-after']
    return {
      status: res.statusCode,
      json: text ? JSON.parse(text) : undefined,
      retryAfter: typeof retryAfter === 'string' ? retryAfter : undefined,
    }
  }
  t.equal((await send(KEYS.admin, 'PUT', '/v1/topics/flood', { partitions: 4 })).status, 201)

  // Idle size, after a little warm-up traffic.
  for (let i = 0; i < 20; i++) await send(KEYS.polite, 'POST', '/v1/topics/flood/messages', { messages: [{ value: `warm-${i}` }] })
  const idleRss = await rssBytes(broker.child.pid!)
  let peakRss = idleRss
  const sampler = setInterval(() => {
    rssBytes(broker.child.pid!).then(
      (b) => {
        peakRss = Math.max(peakRss, b)
      },
      () => {},
    )
  }, 100)
  t.teardown(() => clearInterval(sampler))

  const answers: Answer[] = []
  const until = Date.now() + LOAD_MS
  let seq = 0
  const produceOnce = async (client: keyof typeof KEYS, n: number) => {
    const values = Array.from({ length: n }, () => `${client}-${seq++}`)
    const started = performance.now()
    const res = await send(KEYS[client], 'POST', '/v1/topics/flood/messages', { messages: values.map((value) => ({ value })) })
    answers.push({
      client,
      status: res.status,
      retryAfter: res.retryAfter,
      code: res.json?.code,
      ms: performance.now() - started,
      values,
      results: res.json?.results,
    })
  }
  const loop = async (client: keyof typeof KEYS, n: number, pauseMs = 0) => {
    for (let i = 0; i < MAX_CALLS_PER_LOOP && Date.now() < until; i++) {
      await produceOnce(client, n)
      if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs))
    }
  }
  // The greedy client goes on past the load window until it has met its rate limit: whether it
  // calls faster than 20 a second within the window depends on the machine (on a loaded one it made
  // 148 calls in it, under the bucket's 40 plus 20 a second, and met one 429). The limit only ends
  // a client that never meets it.
  const greedyUntil = until + 120_000
  const greedyRateLimited = () => answers.some((a) => a.client === 'greedy' && a.status === 429)
  const greedyLoop = async () => {
    for (let i = 0; i < MAX_CALLS_PER_LOOP && (Date.now() < until || (!greedyRateLimited() && Date.now() < greedyUntil)); i++) {
      await produceOnce('greedy', 1)
    }
  }
  const greedyStarted = Date.now()
  let greedyMs = 0
  await Promise.all([
    ...Array.from({ length: 8 }, () => loop('bulk', 1000)),
    Promise.all(Array.from({ length: 24 }, greedyLoop)).then(() => {
      greedyMs = Date.now() - greedyStarted
    }),
    loop('polite', 1, 100),
  ])
  clearInterval(sampler)

  const by = (client: string, status?: number) =>
    answers.filter((a) => a.client === client && (status === undefined || a.status === status))
  const accepted = answers.filter((a) => a.status === 201)
  const acceptedMessages = accepted.reduce((n, a) => n + a.values.length, 0)
  const offeredMessages = answers.reduce((n, a) => n + a.values.length, 0)
  const latencies = accepted.map((a) => a.ms).sort((a, b) => a - b)
  const p99 = latencies[Math.floor(latencies.length * 0.99)] ?? 0
  t.comment(
    `offered ${offeredMessages} messages in ${answers.length} calls over ${LOAD_MS} ms; accepted ${acceptedMessages} ` +
      `(${(offeredMessages / Math.max(1, acceptedMessages)).toFixed(1)}x); bulk 503: ${by('bulk', 503).length}/${by('bulk').length}, ` +
      `greedy 429: ${by('greedy', 429).length}/${by('greedy').length}, polite 201: ${by('polite', 201).length}/${by('polite').length}; ` +
      `p99 of accepted calls ${p99.toFixed(0)} ms; RSS idle ${(idleRss / 2 ** 20).toFixed(0)} MiB, peak ${(peakRss / 2 ** 20).toFixed(0)} MiB`,
  )

  // Shedding, and nothing else.
  const others = answers.filter((a) => ![201, 429, 503].includes(a.status))
  t.same(
    others.map((a) => `${a.status} ${a.code}`),
    [],
    'every call was accepted (201) or shed (429/503)',
  )
  const shed = answers.filter((a) => a.status !== 201)
  t.ok(
    shed.every((a) => a.retryAfter !== undefined && Number(a.retryAfter) >= 1),
    'every refusal carries Retry-After',
  )
  t.ok(by('bulk', 503).length >= 5, `the bulk client past the commit backlog gets 503 (${by('bulk', 503).length} times)`)
  t.ok(by('bulk', 201).length < by('bulk').length / 2, "most of the bulk client's calls are shed")
  // What the limiter let through is bounded by its rate, however many calls the greedy client
  // managed to make (how many that was depends on the machine: at 225 calls, 107 were 429s, and
  // "most of them 429" failed on a quiet CI run; "at least 5" failed a loaded one, at 1 of 148):
  // a bucket of 2 x 20 plus 20 a second over the time it called.
  const passed = by('greedy').length - by('greedy', 429).length
  t.ok(by('greedy', 429).length >= 1, `the greedy client past its rate gets 429 (${by('greedy', 429).length} times)`)
  t.ok(passed <= 40 + 20 * (greedyMs / 1000 + 1), `the rate limit let through at most its rate allows (${passed} calls in ${greedyMs} ms)`)
  t.ok(
    answers.filter((a) => a.status === 429).every((a) => a.code === 'rate_limited'),
    '429 is rate_limited',
  )
  t.ok(
    answers.filter((a) => a.status === 503).every((a) => a.code === 'overloaded'),
    '503 is overloaded',
  )
  t.equal(by('polite', 429).length, 0, "the polite client is never rate-limited by the others' load")
  // Its calls may meet a full backlog (503, everyone's answer), and how often depends on the
  // machine: 80-90% got through here, 62% with four test files at once on two cores, 2 of 11 at a
  // load of 15-19 (CI30). Starved by the others' load, it would get none.
  t.ok(by('polite', 201).length >= 1, `the polite client got calls through (${by('polite', 201).length} of ${by('polite').length})`)
  t.ok(
    offeredMessages >= 3 * acceptedMessages,
    `offered load was several times what was accepted (${offeredMessages} vs ${acceptedMessages})`,
  )

  // Bounded: memory near idle, accepted calls answered in bounded time.
  t.ok(peakRss - idleRss < 256 * 2 ** 20, `memory stayed bounded: +${((peakRss - idleRss) / 2 ** 20).toFixed(0)} MiB over idle`)
  // Bounded by the backlog, not by the clock: an accepted call waits at most for the backlog
  // ahead of it and its own batch to commit, at the rate the broker committed in this run (a
  // loaded machine commits slower: p99 4.4 s at load 16-21, 5.6 s at 15-19). A queue that grew
  // with the offered load would take the whole window and more.
  const committedPerMs = Math.max(acceptedMessages, 1) / LOAD_MS
  const drainMs = (2 * BACKLOG) / committedPerMs
  t.ok(
    p99 <= Math.max(5000, 2 * drainMs),
    `p99 of accepted calls bounded by the backlog's drain (${p99.toFixed(0)} ms; a backlog and a batch drain in ${drainMs.toFixed(0)} ms here)`,
  )

  // Every accepted message stored once at its coordinates, nothing refused stored.
  const stored = new Map<string, string>()
  let holes = 0
  for (let p = 0; p < 4; p++) {
    for (let from = 0, pages = 0; pages < 10_000; pages++) {
      let page = await send(KEYS.admin, 'GET', `/v1/topics/flood/partitions/${p}/messages?fromOffset=${from}&limit=1000`)
      // The admin key has the same rate limit: reading it all back waits as told.
      for (let i = 0; page.status === 429 && i < 100; i++) {
        await new Promise((r) => setTimeout(r, Number(page.retryAfter) * 1000))
        page = await send(KEYS.admin, 'GET', `/v1/topics/flood/partitions/${p}/messages?fromOffset=${from}&limit=1000`)
      }
      if (page.json.messages.length === 0) break
      for (const m of page.json.messages as { partition: number; offset: number; value: string }[]) {
        if (m.offset !== from) holes++
        from = m.offset + 1
        stored.set(`${m.partition}:${m.offset}`, m.value)
      }
    }
  }
  t.equal(holes, 0, 'offsets are dense in every partition')
  let misplaced = 0
  for (const a of accepted)
    a.values.forEach((v, i) => {
      const r = a.results![i]!
      if (stored.get(`${r.partition}:${r.offset}`) !== v) misplaced++
    })
  t.equal(misplaced, 0, 'every accepted message is at the coordinates it was answered with')
  const refusedValues = new Set(shed.flatMap((a) => a.values))
  t.equal([...stored.values()].filter((v) => refusedValues.has(v)).length, 0, 'no refused message was stored')
  t.equal(stored.size, acceptedMessages + 20, 'nothing else was stored (accepted plus the warm-up)')

  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0, 'and it still drains and exits cleanly')
})

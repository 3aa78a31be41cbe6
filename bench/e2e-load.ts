/**
 * The load process of the end-to-end scenarios (bench/e2e.ts, bench/ab.ts, bench/scale.ts) (its own process, so that making load shares no event loop with
 * the broker, the receiver or the measuring code). Driven over IPC (bench/lib/ipc.ts):
 *
 *   posts  bare undici POSTs of push-shaped envelopes straight to the receiver: the ceiling of
 *          what the receiver (and loopback HTTP on this machine) takes, `concurrency` loops
 *   bulk   produce `total` messages in batches of `batch` from `concurrency` loops, as fast as
 *          the broker answers; each message value carries its batch's send time `t`
 *   paced  single-message produce calls at `rate` a second (open loop, bounded outstanding),
 *          each value carrying its send time `t` (and `w: 1` during the warm-up)
 *
 * Every loop is bounded in count and in time. Times are wall-clock ms (performance.timeOrigin +
 * performance.now()), comparable with the receiver's on the same machine.
 *
 * argv[2]: JSON {} (unused)
 */
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Agent, Pool, request } from 'undici'
import { serveIpc } from './lib/ipc.ts'
import { FatalAnswer, hookqSender, sendBatches, valueWith } from './lib/batches.ts'
import { Latencies } from './lib/stats.ts'

const wallNow = () => performance.timeOrigin + performance.now()

// ---- posts: the bare HTTP ceiling

interface PostsArgs {
  url: string
  concurrency: number
  warmupS: number
  measureS: number
  maxRequests: number
}

async function posts(a: PostsArgs) {
  // Pooled keep-alive sockets, one per loop, no pipelining: like the broker's push agent.
  const agent = new Agent({ connections: a.concurrency, pipelining: 1, keepAliveTimeout: 4_000 })
  const deliveryIdBase = randomBytes(12).toString('base64url')
  const latencies = new Latencies()
  const non2xx: Record<string, number> = {}
  let seq = 0
  let ok = 0
  let errors = 0
  let measuring = false
  let stopped = false
  let windowStart = 0
  let windowEnd = 0
  const loop = async () => {
    while (!stopped && seq < a.maxRequests) {
      const offset = seq++
      const nowMs = Date.now()
      // The shape and size of a push envelope (src/dispatch/envelope.ts) and its headers.
      const deliveryId = `${deliveryIdBase}${offset.toString(36).padStart(10, '0')}`
      const body =
        `{"deliveryId":"${deliveryId}","topic":"e2e-baseline","group":"e2e-baseline","partition":0,"offset":${offset},` +
        `"key":null,"value":${valueWith(`"t":${wallNow()}`)},"headers":{},"attempt":1,` +
        `"timestamp":"${new Date(nowMs).toISOString()}","ackDeadline":"${new Date(nowMs + 30_000).toISOString()}"}`
      const headers = {
        'content-type': 'application/json',
        'user-agent': 'hookq',
        'hookq-delivery-id': deliveryId,
        'hookq-attempt': '1',
        'webhook-id': `msg_1_0_${offset}`,
        'webhook-timestamp': String(Math.floor(nowMs / 1000)),
      }
      const t0 = performance.now()
      try {
        const res = await request(a.url, { dispatcher: agent, method: 'POST', body, headers, headersTimeout: 10_000, bodyTimeout: 10_000 })
        await res.body.text()
        const status = res.statusCode
        if (!measuring) continue
        if (status >= 200 && status < 300) {
          ok++
          latencies.add(performance.now() - t0)
        } else non2xx[status] = (non2xx[status] ?? 0) + 1
      } catch {
        if (measuring) errors++
        await sleep(10)
      }
    }
  }
  const loops = Array.from({ length: a.concurrency }, loop)
  await sleep(a.warmupS * 1000)
  measuring = true
  windowStart = performance.now()
  await sleep(a.measureS * 1000)
  measuring = false
  windowEnd = performance.now()
  stopped = true
  await Promise.all(loops)
  await agent.close()
  return { ok, errors, non2xx, seconds: (windowEnd - windowStart) / 1000, latencyMs: latencies.summary(), sent: seq }
}

// ---- bulk: produce as fast as the broker answers

interface BulkArgs {
  /** The broker's. */
  url: string
  topic: string
  total: number
  batch: number
  concurrency: number
  maxSeconds: number
  /** Messages a second at most (as fast as the broker answers when absent). */
  rate?: number
}

async function bulk(a: BulkArgs) {
  const sender = hookqSender(a.url, a.topic, a.concurrency)
  const r = await sendBatches(
    { total: a.total, batch: a.batch, loops: a.concurrency, maxSeconds: a.maxSeconds, rate: a.rate },
    sender.send,
    (err) => {
      if (err instanceof FatalAnswer) throw err
    },
  )
  await sender.close()
  return { ...r, non201: sender.non201 }
}

// ---- paced: single messages at a fixed rate

interface PacedArgs {
  url: string
  rate: number
  warmupS: number
  measureS: number
  maxOutstanding: number
  connections: number
}

async function paced(a: PacedArgs) {
  const pool = new Pool(new URL(a.url).origin, { connections: a.connections, pipelining: 1 })
  const path = new URL(a.url).pathname
  const total = Math.round(a.rate * (a.warmupS + a.measureS))
  const warmupCount = Math.round(a.rate * a.warmupS)
  const latencies = new Latencies()
  const non201: Record<string, number> = {}
  let sent = 0
  let produced = 0
  let errors = 0
  let outstanding = 0
  let firstSendAt = NaN
  let measuredFirstSendAt = NaN
  let measuredLastSendAt = NaN
  const sendOne = async (i: number) => {
    const sentAt = wallNow()
    const warm = i < warmupCount
    if (!warm && Number.isNaN(measuredFirstSendAt)) measuredFirstSendAt = sentAt
    if (!warm) measuredLastSendAt = sentAt
    outstanding++
    const t0 = performance.now()
    try {
      const res = await pool.request({
        path,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: `{"messages":[{"value":${valueWith(warm ? `"t":${sentAt},"w":1` : `"t":${sentAt}`)}}]}`,
        headersTimeout: 10_000,
        bodyTimeout: 10_000,
      })
      await res.body.text()
      if (res.statusCode === 201) {
        produced++
        if (!warm) latencies.add(performance.now() - t0)
      } else {
        non201[res.statusCode] = (non201[res.statusCode] ?? 0) + 1
      }
    } catch {
      errors++
    } finally {
      outstanding--
    }
  }
  const inflight = new Set<Promise<void>>()
  const start = performance.now()
  // At the scheduled end (plus a little) it stops, sent or not: a broker that cannot keep up shows as a lower achieved rate.
  const deadline = start + (a.warmupS + a.measureS) * 1000 + 500
  firstSendAt = wallNow()
  // Open loop: every tick sends what the schedule says is due, up to maxOutstanding at once.
  while (sent < total && performance.now() < deadline) {
    const due = Math.min(total, Math.floor(((performance.now() - start) * a.rate) / 1000) + 1)
    while (sent < due) {
      if (outstanding >= a.maxOutstanding) break
      const p = sendOne(sent++)
      inflight.add(p)
      void p.finally(() => inflight.delete(p))
    }
    await sleep(1)
  }
  const lastSendAt = wallNow()
  await Promise.all(inflight)
  await pool.close()
  const measuredS = (measuredLastSendAt - measuredFirstSendAt) / 1000
  return {
    scheduled: total,
    sent,
    produced,
    errors,
    non201,
    firstSendAt,
    lastSendAt,
    achievedRate: measuredS > 0 ? (sent - warmupCount - 1) / measuredS : NaN,
    produceLatencyMs: latencies.summary(),
  }
}

/** What each command answers. */
export type Answers = {
  posts: Awaited<ReturnType<typeof posts>>
  bulk: Awaited<ReturnType<typeof bulk>>
  paced: Awaited<ReturnType<typeof paced>>
}

serveIpc({ posts, bulk, paced } as Record<string, (args: never) => unknown>, { pid: process.pid })
process.on('SIGTERM', () => process.exit(0))

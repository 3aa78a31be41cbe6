/**
 * The produce loop the load processes share (bench/e2e-load.ts's bulk, bench/peers-produce.ts):
 * `total` messages in batches of `batch` from `loops` concurrent loops, as fast as the system takes
 * them, or at `rate` messages a second when given. A batch that fails, or that the system refuses for now, is sent again, up to 5 times. Bounded
 * in count and in time (`maxSeconds`). Times are wall-clock ms, comparable across the bench's processes.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { Pool } from 'undici'
import { Latencies } from './stats.ts'

/** The message value of every produce load and of the ceiling's bodies: a JSON object of about 200 bytes. */
export const MESSAGE_VALUE = {
  event: 'order.created',
  orderId: 'ord-7f3a9c2e-51b4-4d8e-9a61-2c0b7e4f8d13',
  customer: { id: 'cus-000123456', tier: 'gold' },
  items: [
    { sku: 'SKU-4411', qty: 2, price: 19.99 },
    { sku: 'SKU-9020', qty: 1, price: 5.5 },
  ],
  note: 'deliver to the side door',
}
const MESSAGE_VALUE_JSON = JSON.stringify(MESSAGE_VALUE)
/** MESSAGE_VALUE's JSON with extra fields spliced in (`"t":123`): drop its closing brace. */
export const valueWith = (extra: string) => `${MESSAGE_VALUE_JSON.slice(0, -1)},${extra}}`

const wallNow = () => performance.timeOrigin + performance.now()
const ATTEMPTS = 5

export interface BatchLoad {
  total: number
  batch: number
  loops: number
  maxSeconds: number
  /** Messages a second at most: batch b goes no sooner than b × batch / rate seconds after the start (closed loops, so slower when answers lag). */
  rate?: number
}

/**
 * Sends messages `first`…`first + n - 1` from loop `loop`, stamped `sentAt`. Resolves undefined once
 * they are taken, or with a wait in ms when the system refused them for now (429/503: sent again
 * after it). A throw is a failed attempt, passed to `onError`, which may throw to end the run.
 */
export type SendBatch = (loop: number, first: number, n: number, sentAt: number) => Promise<number | undefined>

export async function sendBatches(a: BatchLoad, send: SendBatch, onError: (err: unknown, attempt: number) => void) {
  const batches = Math.ceil(a.total / a.batch)
  const start = performance.now()
  const deadline = start + a.maxSeconds * 1000
  const latencies = new Latencies()
  let nextBatch = 0
  let produced = 0
  let errors = 0
  let refusals = 0
  let firstSendAt = NaN
  let lastAnswerAt = NaN
  const loop = async (i: number) => {
    while (nextBatch < batches && performance.now() < deadline) {
      const b = nextBatch++
      const n = Math.min(a.batch, a.total - b * a.batch)
      if (a.rate !== undefined) {
        const dueMs = start + (b * a.batch * 1000) / a.rate - performance.now()
        if (dueMs > 0) await sleep(dueMs)
      }
      for (let attempt = 1; attempt <= ATTEMPTS && performance.now() < deadline; attempt++) {
        const sentAt = wallNow()
        if (Number.isNaN(firstSendAt)) firstSendAt = sentAt
        const t0 = performance.now()
        let waitMs: number | undefined
        try {
          waitMs = await send(i, b * a.batch, n, sentAt)
        } catch (err) {
          errors++
          onError(err, attempt)
          await sleep(50)
          continue
        }
        if (waitMs === undefined) {
          produced += n
          lastAnswerAt = wallNow()
          latencies.add(performance.now() - t0)
          break
        }
        refusals++
        await sleep(waitMs)
      }
    }
  }
  await Promise.all(Array.from({ length: a.loops }, (_, i) => loop(i)))
  return {
    produced,
    errors,
    retries: errors + refusals,
    firstSendAt,
    lastAnswerAt,
    timedOut: produced < a.total,
    latencyMs: latencies.summary(),
  }
}

/** An answer no retry can mend (not 201, 429 or 503). */
export class FatalAnswer extends Error {}

/**
 * Batches of MESSAGE_VALUE (with the batch's send time `t`) to hookq's topic `topic` at `brokerUrl`,
 * one pooled connection a loop; answers not 201 counted in `non201`. The broker shedding load
 * (429, 503): its Retry-After honoured (capped), then the batch sent again.
 */
export function hookqSender(brokerUrl: string, topic: string, connections: number) {
  const pool = new Pool(brokerUrl, { connections, pipelining: 1 })
  const non201: Record<string, number> = {}
  const send: SendBatch = async (_loop, _first, n, sentAt) => {
    const one = `{"value":${valueWith(`"t":${sentAt}`)}}`
    const res = await pool.request({
      path: `/v1/topics/${encodeURIComponent(topic)}/messages`,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"messages":[${Array(n).fill(one).join(',')}]}`,
      headersTimeout: 30_000,
      bodyTimeout: 30_000,
    })
    const text = await res.body.text()
    if (res.statusCode === 201) return undefined
    non201[res.statusCode] = (non201[res.statusCode] ?? 0) + 1
    if (res.statusCode !== 429 && res.statusCode !== 503) throw new FatalAnswer(`produce answered ${res.statusCode}: ${text.slice(0, 300)}`)
    return Math.min(1000, Math.max(20, Number(res.headers['retry-after'] ?? 0) * 1000))
  }
  return { send, non201, close: () => pool.close() }
}

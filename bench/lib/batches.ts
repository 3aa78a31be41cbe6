/**
 * The produce loop the load processes share (bench/e2e-load.ts's bulk, bench/peers-produce.ts):
 * `total` messages in batches of `batch` from `loops` concurrent loops, as fast as the system takes
 * them, or at `rate` messages a second when given. A batch that fails, or that the system refuses for now, is sent again, up to 5 times. Bounded
 * in count and in time (`maxSeconds`). Times are wall-clock ms, comparable across the bench's processes.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { Latencies } from './stats.ts'

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

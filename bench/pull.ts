/**
 * Pull delivery against push (`npm run bench:pull`): one broker on a fresh database, a backlog of
 * BENCH_MESSAGES messages on 8 partitions, drained twice on the same machine:
 *   - pull: 8 callers, each pulling maxMessages 100 (waitMs 1000) and acking what it got;
 *   - push: a group in auto mode pushing to a receiver on 127.0.0.1 that answers 200.
 * Then the long poll's latency: one caller waiting (waitMs 20000), one message produced; the time
 * from the produce call to the pull's answer, BENCH_POLLS times, beside the produce call's own
 * time (a ratio, as the machine's load moves both). Every loop is bounded in count and time.
 *
 * Environment (all optional): BENCH_MESSAGES=20000  BENCH_POLLS=200  BENCH_DATABASE_URL=...
 */
import { brokerApi, serve, startBroker } from './lib/broker.ts'
import { createBenchDatabase } from './lib/db.ts'
import { envCount, SERVER_URL } from './lib/env.ts'
import { cpuSince, cpuSnapshot, perMessage } from './lib/proc.ts'
import { cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { quantile as q } from './lib/stats.ts'

const MESSAGES = envCount('BENCH_MESSAGES', 20_000)
const POLLS = envCount('BENCH_POLLS', 200)
const CALLERS = 8
const LIMIT_MS = 300_000

cleanUpOnInterrupt('the broker')
await runBench(async () => {
  run.db = await createBenchDatabase(SERVER_URL)
  const broker = (run.broker = await startBroker(run.db.url, { timeoutMs: 120_000 }))
  const api = <T = unknown>(method: string, path: string, body?: unknown) => brokerApi<T>(broker.url, method, path, body)
  await api('PUT', '/v1/topics/backlog', { partitions: 8 })
  for (let i = 0; i < MESSAGES; i += 100) {
    const n = Math.min(100, MESSAGES - i)
    await api('POST', '/v1/topics/backlog/messages', { messages: Array.from({ length: n }, (_, k) => ({ value: { n: i + k } })) })
  }
  const drained = async (group: string) => {
    const s = await api<{ partitions: { lag: number; inFlight: number }[] }>('GET', `/v1/groups/${group}`)
    return s.partitions.every((p) => p.lag === 0 && p.inFlight === 0)
  }

  // ---- pull + ack, 8 callers ----
  const pullCpu = cpuSnapshot(broker.pid)
  const pullFrom = Date.now()
  await api('PUT', '/v1/groups/pulled', { topic: 'backlog', delivery: 'pull', maxInFlight: 1000 })
  let taken = 0
  // Each call's time, to tell where a caller's cycle goes (a pull answered, then its ack).
  const pullCallMs: number[] = []
  const ackCallMs: number[] = []
  const pullSizes: number[] = []
  const caller = async () => {
    while (taken < MESSAGES && Date.now() - pullFrom < LIMIT_MS) {
      const t0 = performance.now()
      const { messages } = await api<{ messages: { deliveryId: string }[] }>('POST', '/v1/groups/pulled/pull', {
        maxMessages: 100,
        waitMs: 1000,
      })
      const t1 = performance.now()
      pullCallMs.push(t1 - t0)
      pullSizes.push(messages.length)
      if (messages.length === 0) continue
      await api('POST', '/v1/groups/pulled/acks', { deliveryIds: messages.map((m) => m.deliveryId) })
      ackCallMs.push(performance.now() - t1)
      taken += messages.length
    }
  }
  await Promise.all(Array.from({ length: CALLERS }, caller))
  const pullMs = Date.now() - pullFrom
  const pullUs = perMessage(cpuSince(pullCpu, broker.pid), MESSAGES)

  // ---- push, auto mode ----
  const receiver = await serve(() => undefined)
  const pushCpu = cpuSnapshot(broker.pid)
  const pushFrom = Date.now()
  await api('PUT', '/v1/groups/pushed', { topic: 'backlog', ackMode: 'auto', maxInFlight: 1000 })
  await api('POST', '/v1/groups/pushed/consumers', { url: `${receiver.url}/` })
  while (!(await drained('pushed')) && Date.now() - pushFrom < LIMIT_MS) await new Promise((r) => setTimeout(r, 20))
  const pushMs = Date.now() - pushFrom
  const pushUs = perMessage(cpuSince(pushCpu, broker.pid), MESSAGES)
  receiver.close()

  // ---- long poll: produce → answer ----
  await api('PUT', '/v1/topics/poll', { partitions: 8 })
  await api('PUT', '/v1/groups/poller', { topic: 'poll', delivery: 'pull' })
  const answerMs: number[] = []
  const produceMs: number[] = []
  // The answer's lag behind the produce call's own answer: the broker's wake, lease and answer after
  // the commit (the produce is answered once committed, as the waiting caller is woken).
  const afterMs: number[] = []
  const pollFrom = Date.now()
  for (let i = 0; i < POLLS && Date.now() - pollFrom < LIMIT_MS; i++) {
    const waiting = api<{ messages: { deliveryId: string }[] }>('POST', '/v1/groups/poller/pull', { waitMs: 20_000, maxMessages: 1 })
    await new Promise((r) => setTimeout(r, 5)) // the pull reaches the broker first
    const t0 = performance.now()
    await api('POST', '/v1/topics/poll/messages', { messages: [{ value: i }] })
    produceMs.push(performance.now() - t0)
    const { messages } = await waiting
    answerMs.push(performance.now() - t0)
    afterMs.push(answerMs.at(-1)! - produceMs.at(-1)!)
    if (messages.length > 0) await api('POST', '/v1/groups/poller/acks', { deliveryIds: messages.map((m) => m.deliveryId) })
  }
  const rate = (ms: number) => (MESSAGES / (ms / 1000)).toFixed(0)
  console.log(
    `backlog of ${MESSAGES} on 8 partitions, drained by: pull + ack (${CALLERS} callers, maxMessages 100) ${rate(pullMs)} msg/s; push (auto mode) ${rate(pushMs)} msg/s`,
  )
  console.log(`pull / push: ${(pushMs / pullMs).toFixed(2)}x the rate (goal >= 1)`)
  console.log(
    `pull + ack calls: ${pullCallMs.length} pulls (p50 ${q(pullCallMs, 50).toFixed(1)} ms, p99 ${q(pullCallMs, 99).toFixed(1)} ms, ` +
      `${(pullSizes.reduce((a, b) => a + b, 0) / Math.max(1, pullSizes.length)).toFixed(0)} messages each on average), ` +
      `acks p50 ${q(ackCallMs, 50).toFixed(1)} ms, p99 ${q(ackCallMs, 99).toFixed(1)} ms`,
  )
  const us = (m: { brokerUs: number; postgresUs: number }) => `broker ${m.brokerUs.toFixed(0)} us, PostgreSQL ${m.postgresUs.toFixed(0)} us`
  console.log(
    `CPU per message: pull + ack ${us(pullUs)}; push ${us(pushUs)}; pull / push broker ${(pullUs.brokerUs / pushUs.brokerUs).toFixed(2)}x, PostgreSQL ${(pullUs.postgresUs / pushUs.postgresUs).toFixed(2)}x`,
  )
  console.log(
    `long poll, produce → answer over ${answerMs.length} polls: p50 ${q(answerMs, 50).toFixed(1)} ms, p99 ${q(answerMs, 99).toFixed(1)} ms ` +
      `(the produce call alone: p50 ${q(produceMs, 50).toFixed(1)} ms, p99 ${q(produceMs, 99).toFixed(1)} ms; ` +
      `answer / produce p99 ${(q(answerMs, 99) / q(produceMs, 99)).toFixed(2)}x; goal p99 <= 10 ms)`,
  )
  console.log(
    `long poll, the answer after the produce call's own: p50 ${q(afterMs, 50).toFixed(1)} ms, p99 ${q(afterMs, 99).toFixed(1)} ms`,
  )
})

/**
 * Kill to resume (`npm run bench:failover`, issue 29 item 3): two broker processes share a group of
 * 8 partitions under a steady produce (one message a partition every 50 ms, through the survivor);
 * one is SIGKILLed, and the bench measures how long after the kill every partition is pushed again
 * (the largest gap, over the partitions, from the kill to the partition's first push after it). A
 * replacement process then joins, the partitions balance again, and the next round kills the other.
 * Also counted: the messages pushed more than once (auto acks: those in flight at the kill, and those
 * answered whose completion was not written yet), per kill. BENCH_FAILOVER_ACK=explicit: the group
 * acks explicitly; the receiver answers 200 and acks every push it got through the process that
 * produces, every 20 ms, and the ack calls answered 503 (a partition moving) are counted, each such
 * delivery id acked again in the next call.
 *
 * Environment (all optional): BENCH_FAILOVER_ROUNDS=4  BENCH_FAILOVER_ACK=auto|explicit
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { brokerApi, serve, startBroker, type BrokerProcess } from './lib/broker.ts'
import { createBenchDatabase } from './lib/db.ts'
import { envInt, SERVER_URL } from './lib/env.ts'
import { atCleanup, cleanUpOnInterrupt, run, runBench } from './lib/run.ts'
import { median } from './lib/stats.ts'

const ROUNDS = envInt('BENCH_FAILOVER_ROUNDS', 4)
const EXPLICIT = process.env.BENCH_FAILOVER_ACK === 'explicit'
const PARTITIONS = 8

async function owned(b: BrokerProcess): Promise<number> {
  const text = await (await fetch(`${b.url}/metrics`, { signal: AbortSignal.timeout(10_000) })).text()
  return Number(/^hookq_partitions_owned (\d+)$/m.exec(text)?.[1] ?? -1)
}

async function until(what: string, ms: number, check: () => Promise<boolean> | boolean): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (await Promise.resolve(check()).catch(() => false)) return
    await sleep(100)
  }
  throw new Error(`timed out waiting for ${what}`)
}

cleanUpOnInterrupt('the brokers')
await runBench(async () => {
  run.db = await createBenchDatabase(SERVER_URL)
  const db = run.db
  // Every push's arrival time, by partition.
  const pushes: number[][] = Array.from({ length: PARTITIONS }, () => [])
  // Pushes of each message ("partition:offset"), for the duplicates.
  const times = new Map<string, number>()
  // Explicit acks: the delivery ids waiting for an ack call, and how those calls were answered.
  let toAck: string[] = []
  const ackCalls = { calls: 0, ids: 0, unavailable: 0, failed: 0 }
  const receiver = await serve((body) => {
    const { partition: p, offset, deliveryId } = JSON.parse(body) as { partition: number; offset: number; deliveryId: string }
    if (EXPLICIT) toAck.push(deliveryId)
    pushes[p]!.push(Date.now())
    times.set(`${p}:${offset}`, (times.get(`${p}:${offset}`) ?? 0) + 1)
    return undefined
  })
  atCleanup(async () => receiver.close())
  const receiverUrl = `${receiver.url}/`
  const brokers: BrokerProcess[] = []
  atCleanup(async () => {
    for (const b of brokers) if (b.child.exitCode === null) b.child.kill('SIGKILL')
  })
  const start = async () => {
    const b = await startBroker(db.url, { timeoutMs: 120_000, env: { HOOKQ_DB_POOL_SIZE: '4' } })
    brokers.push(b)
    return b
  }
  const live = [await start(), await start()]
  await brokerApi(live[0]!.url, 'PUT', '/v1/topics/fo', { partitions: PARTITIONS })
  await brokerApi(live[0]!.url, 'PUT', '/v1/groups/fo-g', { topic: 'fo', ackMode: EXPLICIT ? 'explicit' : 'auto' })
  await brokerApi(live[0]!.url, 'POST', '/v1/groups/fo-g/consumers', { url: receiverUrl })

  let producing = true
  const producer = (async () => {
    while (producing) {
      const via = live[live.length - 1]!
      await brokerApi(via.url, 'POST', '/v1/topics/fo/messages', {
        messages: Array.from({ length: PARTITIONS }, (_, p) => ({ value: p, partition: p })),
      }).catch(() => {})
      await sleep(50)
    }
  })()

  const acker = (async () => {
    while (producing || toAck.length > 0) {
      const ids = toAck.splice(0, 1000)
      if (ids.length > 0) {
        const via = live[live.length - 1]!
        ackCalls.calls++
        ackCalls.ids += ids.length
        const res = await fetch(`${via.url}/v1/groups/fo-g/acks`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ deliveryIds: ids }),
          signal: AbortSignal.timeout(10_000),
        }).catch(() => undefined)
        await res?.arrayBuffer()
        if (res?.status === 503) ackCalls.unavailable++
        else if (res?.status !== 200) ackCalls.failed++
        // Asked again in the next call, as a client does after a 503 or a broken connection.
        if (res?.status !== 200) toAck = [...ids, ...toAck]
      }
      await sleep(20)
    }
  })()

  const results: number[] = []
  for (let round = 0; round < ROUNDS; round++) {
    await until('each process owns half the partitions', 60_000, async () => (await owned(live[0]!)) === 4 && (await owned(live[1]!)) === 4)
    // Every partition pushed within the last second: the flow is steady.
    await until('every partition pushed', 30_000, () => pushes.every((xs) => (xs.at(-1) ?? 0) > Date.now() - 1000))
    const victim = live.shift()!
    const killedAt = Date.now()
    victim.child.kill('SIGKILL')
    await until('every partition pushed after the kill', 60_000, () => pushes.every((xs) => (xs.at(-1) ?? 0) >= killedAt))
    const resumeMs = Math.max(...pushes.map((xs) => xs.find((x) => x >= killedAt)! - killedAt))
    results.push(resumeMs)
    console.log(`round ${round + 1}: pushes resumed on every partition ${resumeMs} ms after the SIGKILL`)
    // Produce through the survivor while the replacement starts.
    live.unshift(await start())
  }
  producing = false
  await producer
  await Promise.race([acker, sleep(15_000)])
  toAck = []
  const duplicates = [...times.values()].filter((n) => n > 1).length
  console.log(
    `messages pushed more than once: ${duplicates} of ${times.size} (${(duplicates / ROUNDS).toFixed(1)} a kill, ${((100 * duplicates) / times.size).toFixed(2)}%)`,
  )
  if (EXPLICIT) {
    console.log(
      `ack calls: ${ackCalls.calls} (${ackCalls.ids} ids); answered 503: ${ackCalls.unavailable} (${(ackCalls.unavailable / ROUNDS).toFixed(1)} a round of a kill and a join, ${((100 * ackCalls.unavailable) / Math.max(1, ackCalls.calls)).toFixed(2)}% of calls); other failures: ${ackCalls.failed}`,
    )
  }
  console.log(`kill to resume over ${ROUNDS} rounds: median ${median(results)} ms, max ${Math.max(...results)} ms (${results.join(', ')})`)
  for (const b of brokers) if (b.child.exitCode === null) b.child.kill('SIGKILL')
})

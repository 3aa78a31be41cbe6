// `node --import tsx test/faults/moves.ts`: what partition moves cost a consumer, measured (issue 29,
// item 3). Three broker processes on a fresh database, an explicit-ack group whose consumer acks
// every push 20 ms after it arrives (through any live process, again on a 503), produce load on
// every partition, and moves: a process joins, one leaves (SIGTERM), and SIGKILLs with a
// replacement started. Prints duplicates and 503-answered ack calls per move, the time from each
// kill until every partition is pushed again, and each process's time from spawn to /readyz 200.
// Needs DATABASE_URL (default: the local server); every loop is bounded in count and time.
process.env.DATABASE_URL ??= 'postgresql://postgres@127.0.0.1:5432/postgres'
const { testDatabase } = await import('../helpers/db.ts')
const { spawnBroker, callBroker: call } = await import('../helpers/process.ts')
const { startReceiver } = await import('../helpers/receiver.ts')
const { waitUntil } = await import('../helpers/wait.ts')
type BrokerProcess = Awaited<ReturnType<typeof spawnBroker>>

const teardowns: (() => unknown)[] = []
const host = { teardown: (fn: () => unknown) => void teardowns.push(fn) }
const PARTITIONS = 12
const KILLS = Number(process.env.MOVES_KILLS ?? 3)

const db = await testDatabase(host)
const env = { DATABASE_URL: db.url, HOOKQ_DB_POOL_SIZE: '4' }
const live: BrokerProcess[] = []
const all: BrokerProcess[] = []
const readyMs: number[] = []
async function start(): Promise<BrokerProcess> {
  const t0 = Date.now()
  const b = await spawnBroker(env, 120_000)
  await waitUntil(async () => (await call(b.url, 'GET', '/readyz')).status === 200, 120_000, 'ready', 20)
  readyMs.push(Date.now() - t0)
  all.push(b)
  live.push(b)
  return b
}

try {
  await Promise.all([start(), start(), start()])
  const pushes: { p: number; o: number; attempt: number; at: number }[] = []
  let ackCalls = 0
  let ack503 = 0
  const why503 = new Map<string, number>()
  let turn = 0
  const ackedAt = new Map<string, number>()
  const ack = async (id: string, k: string) => {
    for (let i = 0; i < 100 && !ackedAt.has(k); i++) {
      const via = live[turn++ % live.length]!
      ackCalls++
      const res = await call(via.url, 'POST', '/v1/groups/mg/acks', { deliveryIds: [id] }).catch(() => undefined)
      if (res?.status === 200) {
        if (res.json.results[0].status !== 'unknown') ackedAt.set(k, Date.now())
        return
      }
      if (res?.status === 503) {
        ack503++
        const why = String(res.json?.detail ?? '').slice(0, 70)
        why503.set(why, (why503.get(why) ?? 0) + 1)
      }
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  const receiver = await startReceiver(host, (req) => {
    const e = req.json as { partition: number; offset: number; attempt: number; deliveryId: string }
    pushes.push({ p: e.partition, o: e.offset, attempt: e.attempt, at: Date.now() })
    setTimeout(() => void ack(e.deliveryId, `${e.partition}:${e.offset}`), 20)
    return { status: 200 }
  })
  const a = live[0]!
  await call(a.url, 'PUT', '/v1/topics/mt', { partitions: PARTITIONS })
  await call(a.url, 'PUT', '/v1/groups/mg', { topic: 'mt', ackMode: 'explicit', ackTimeoutMs: 10_000 })
  await call(a.url, 'POST', '/v1/groups/mg/consumers', { url: receiver.url })

  let producing = true
  let produced = 0
  const producer = (async () => {
    const until = Date.now() + 300_000
    while (producing && Date.now() < until) {
      const via = live[produced % live.length]!
      const res = await call(via.url, 'POST', '/v1/topics/mt/messages', {
        messages: Array.from({ length: 24 }, (_, i) => ({ key: `k${produced + i}`, value: produced + i })),
      }).catch(() => undefined)
      if (res?.status === 201) produced += 24
      await new Promise((r) => setTimeout(r, 50))
    }
  })()
  const settle = () => new Promise((r) => setTimeout(r, 3000))
  const resumes: number[] = []
  /** From `t0`, how long until every partition had a push again. */
  const resumed = async (t0: number) => {
    await waitUntil(() => new Set(pushes.filter((x) => x.at > t0).map((x) => x.p)).size === PARTITIONS, 60_000, 'pushes resume', 20)
    const first = new Map<number, number>()
    for (const x of pushes) if (x.at > t0 && !first.has(x.p)) first.set(x.p, x.at)
    return Math.max(...first.values()) - t0
  }
  const moves: string[] = []
  await settle()
  await start()
  moves.push('join')
  await settle()
  const leaving = live.shift()!
  leaving.child.kill('SIGTERM')
  await leaving.exited
  moves.push('leave (SIGTERM)')
  await settle()
  for (let k = 0; k < KILLS; k++) {
    const victim = live.shift()!
    victim.child.kill('SIGKILL')
    const t0 = Date.now()
    await victim.exited
    moves.push('SIGKILL')
    resumes.push(await resumed(t0))
    await start()
    moves.push('join (replacement)')
    await settle()
  }
  producing = false
  await producer
  // Stored messages whose produce call died with its process count too: the pushes say what there is.
  const unacked = () => new Set(pushes.map((x) => `${x.p}:${x.o}`)).size - ackedAt.size
  await waitUntil(() => ackedAt.size >= produced && unacked() === 0, 120_000, 'every message acked', 100).catch((err: unknown) =>
    console.log(`${String(err)}: ${unacked()} pushed messages not acked`),
  )
  const distinct = new Set(pushes.map((x) => `${x.p}:${x.o}`)).size
  const dup = pushes.length - distinct
  console.log(`moves: ${moves.join(', ')} (${moves.length})`)
  console.log(
    `messages ${produced}, pushes ${pushes.length}: ${dup} duplicates (${((100 * dup) / pushes.length).toFixed(2)}%), ${(dup / moves.length).toFixed(1)} per move`,
  )
  console.log(
    `ack calls ${ackCalls}: ${ack503} answered 503 (${((100 * ack503) / ackCalls).toFixed(2)}%), ${(ack503 / moves.length).toFixed(1)} per move`,
  )
  console.log(`503s by detail: ${[...why503].map(([w, n]) => `${n}× ${w}`).join('; ')}`)
  console.log(`pushes resumed on every partition after each SIGKILL: ${resumes.join(', ')} ms`)
  console.log(`spawn to /readyz 200: ${readyMs.join(', ')} ms`)
} finally {
  for (const b of all) if (b.child.exitCode === null) b.child.kill('SIGKILL')
  for (const fn of teardowns.reverse()) await fn()
}

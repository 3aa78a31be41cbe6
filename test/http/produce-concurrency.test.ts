import t from '../helpers/tap.ts'
import { createBroker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'

const { url, broker } = await startListeningBroker(t)

async function call(method: string, path: string, body?: unknown, base = url) {
  const res = await fetch(base + path, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
  })
  return { status: res.status, json: (await res.json()) as any }
}

t.test(
  '50 concurrent producers on one partition: dense offsets, every acknowledged message exactly once, no reader sees a gap',
  async (t) => {
    t.equal((await call('PUT', '/v1/topics/hot', { partitions: 1 })).status, 201)
    const PRODUCERS = 50
    const CALLS = 10
    const PER_CALL = 3
    const acked = new Map<number, string>() // offset → value
    let done = false

    // A reader polling the partition: whatever it sees must be offsets 0..n-1 with no hole, and
    // n never shrinks: offset n+1 is never visible before n.
    let readerViews = 0
    const reader = (async () => {
      let lastCount = 0
      while (!done) {
        const page = await call('GET', '/v1/topics/hot/partitions/0/messages?fromOffset=0&limit=1000')
        const offsets = page.json.messages.map((m: { offset: number }) => m.offset)
        offsets.forEach((o: number, i: number) => {
          if (o !== i) throw new Error(`reader saw offset ${o} at position ${i}`)
        })
        if (offsets.length < lastCount) throw new Error('the visible log shrank')
        lastCount = offsets.length
        readerViews++
      }
    })()

    await Promise.all(
      Array.from({ length: PRODUCERS }, async (_, p) => {
        for (let c = 0; c < CALLS; c++) {
          const values = Array.from({ length: PER_CALL }, (_, i) => `p${p}-c${c}-m${i}`)
          const res = await call('POST', '/v1/topics/hot/messages', { messages: values.map((value) => ({ value })) })
          if (res.status !== 201) throw new Error(`produce answered ${res.status}: ${JSON.stringify(res.json)}`)
          const offsets = res.json.results.map((r: { offset: number }) => r.offset)
          for (let i = 1; i < offsets.length; i++) {
            if (offsets[i] !== offsets[i - 1] + 1) throw new Error('one call got non-contiguous offsets')
          }
          res.json.results.forEach((r: { partition: number; offset: number }, i: number) => {
            if (acked.has(r.offset)) throw new Error(`offset ${r.offset} handed out twice`)
            acked.set(r.offset, values[i]!)
          })
        }
      }),
    )
    done = true
    await reader
    t.ok(readerViews > 0, 'the reader ran alongside')

    const total = PRODUCERS * CALLS * PER_CALL
    t.equal(acked.size, total)
    const stored: { offset: number; value: string }[] = []
    for (let from = 0; ; ) {
      const page = await call('GET', `/v1/topics/hot/partitions/0/messages?fromOffset=${from}&limit=1000`)
      if (page.json.messages.length === 0) break
      stored.push(...page.json.messages)
      from = page.json.nextOffset
    }
    t.same(
      stored.map((m) => m.offset),
      Array.from({ length: total }, (_, i) => i),
      'offsets 0..n-1, dense',
    )
    const mismatched = stored.filter((m) => acked.get(m.offset) !== m.value)
    t.equal(mismatched.length, 0, 'each offset holds the message acknowledged with it')
    t.equal(new Set(stored.map((m) => m.value)).size, total, 'each message exactly once')
    const detail = await call('GET', '/v1/topics/hot')
    t.same(detail.json.partitionStats, [{ partition: 0, startOffset: 0, endOffset: total }])
  },
)

t.test(
  'two brokers on one database, each with concurrent appends, share a partition without gaps or deadlocks',
  { skip: needsServer },
  async (t) => {
    const config = loadConfig({
      DATABASE_URL: broker.databaseUrl,
      HOOKQ_COMMIT_CONCURRENCY: '4',
      HOOKQ_DB_POOL_SIZE: '6',
      LOG_LEVEL: 'silent',
    })
    const brokers = await Promise.all([createBroker(config), createBroker(config)])
    t.teardown(() => Promise.all(brokers.map((b) => b.close())))
    const bases = await Promise.all(brokers.map((b) => b.app.listen({ host: '127.0.0.1', port: 0 })))
    t.equal((await call('PUT', '/v1/topics/shared', { partitions: 3 }, bases[0])).status, 201)
    const acked: string[] = []
    await Promise.all(
      Array.from({ length: 40 }, async (_, p) => {
        for (let c = 0; c < 10; c++) {
          // Each call spans all three partitions, so concurrent appends contend for the same locks.
          const messages = [0, 1, 2].map((partition) => ({ value: `p${p}-c${c}-${partition}`, partition }))
          const res = await call('POST', '/v1/topics/shared/messages', { messages }, bases[p % 2])
          if (res.status !== 201) throw new Error(`produce answered ${res.status}`)
          res.json.results.forEach((r: { partition: number; offset: number }, i: number) => {
            acked.push(`${r.partition}:${r.offset}=${messages[i]!.value}`)
          })
        }
      }),
    )
    for (const partition of [0, 1, 2]) {
      const page = await call('GET', `/v1/topics/shared/partitions/${partition}/messages?limit=1000`)
      const stored = page.json.messages.map((m: { offset: number; value: string }) => `${partition}:${m.offset}=${m.value}`)
      t.same(
        page.json.messages.map((m: { offset: number }) => m.offset),
        Array.from({ length: 400 }, (_, i) => i),
        `partition ${partition} dense`,
      )
      t.same(
        stored.sort(),
        acked.filter((a) => a.startsWith(`${partition}:`)).sort(),
        `partition ${partition} holds exactly what was acknowledged`,
      )
    }
  },
)

t.test('past the commit backlog, produce sheds with 503 + Retry-After and stores nothing of the shed calls', async (t) => {
  const small = await startListeningBroker(t, { HOOKQ_COMMIT_MAX_PENDING_MESSAGES: '10' })
  t.equal((await call('PUT', '/v1/topics/shed', { partitions: 1 }, small.url)).status, 201)
  // In-process calls, all started in one turn: they reach the committer before its first commit
  // can finish, whatever the database's speed, so the backlog limit is certain to be hit.
  const answers = await Promise.all(
    Array.from({ length: 200 }, async (_, i) => {
      const res = await small.broker.app.inject({
        method: 'POST',
        url: '/v1/topics/shed/messages',
        payload: { messages: [{ value: `m${i}` }, { value: `m${i}b` }] },
      })
      return { i, status: res.statusCode, retryAfter: res.headers['retry-after'], body: res.json() as any }
    }),
  )
  const shed = answers.filter((a) => a.status === 503)
  const accepted = answers.filter((a) => a.status === 201)
  t.equal(shed.length + accepted.length, 200, 'every call is either accepted or shed')
  t.ok(shed.length > 0, `some calls were shed (${shed.length} of 200)`)
  for (const s of shed) {
    t.equal(s.retryAfter, '1')
    t.equal(s.body.code, 'overloaded')
  }
  const stored = await call('GET', '/v1/topics/shed/partitions/0/messages?limit=1000', undefined, small.url)
  const values = new Set(stored.json.messages.map((m: { value: string }) => m.value))
  t.equal(values.size, accepted.length * 2, 'exactly the accepted calls are stored')
  for (const s of shed) t.notOk(values.has(`m${s.i}`), `shed call ${s.i} stored nothing`)
})

/**
 * Acknowledgement against the real broker: nacks (with a delay, with the backoff, straight to the
 * dead-letter topic, of foreign, unknown and superseded ids), extend, concurrent duplicate acks,
 * acks of another group's ids, and the durability of an answered ack (checked in the tables).
 */
import t from '../helpers/tap.ts'
import { api } from '../helpers/api.ts'
import { startBroker } from '../helpers/broker.ts'
import { env, pushGroups, type TT } from '../helpers/push-group.ts'
import { startReceiver } from '../helpers/receiver.ts'
import { absenceWindow, waitUntil } from '../helpers/wait.ts'

const broker = await startBroker(t)
const { call, produce, sql, groupStatus } = api(broker)
// The tests run side by side on the one broker: each has its own topic, group and receiver, and most
// of a test's time is a deadline, backoff or absence window passing, which they need not take in turn.
t.jobs = 4
const { attemptRows, groupWithReceiver } = pushGroups({ call, sql })

type Status = 'acked' | 'nacked' | 'extended' | 'already_completed' | 'unknown'
const statuses = (res: { json: { results: { status: Status }[] } }) => res.json.results.map((r) => r.status)
const ack = async (group: string, ids: string[]) => statuses(await call('POST', `/v1/groups/${group}/acks`, { deliveryIds: ids }))
const nack = async (group: string, ids: string[], extra: object = {}) =>
  statuses(await call('POST', `/v1/groups/${group}/nacks`, { deliveryIds: ids, ...extra }))
const extend = async (group: string, ids: string[], extendMs: number) =>
  statuses(await call('POST', `/v1/groups/${group}/extend`, { deliveryIds: ids, extendMs }))
/** Topic + group + one consumer; returns the timed receiver. */
const setup = (tt: TT, name: string, group: object, partitions = 1) => groupWithReceiver(tt, name, group, { partitions })

t.test('nack with delayMs: pushed again not before the delay, as attempt 2 with a new id', async (t) => {
  const { receiver, times } = await setup(t, 'nd', { ackTimeoutMs: 30_000, retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 } })
  await produce('nd', [{ value: 'x' }])
  await receiver.waitFor(1)
  const first = env(receiver.requests[0])
  const nackAt = Date.now()
  t.same(await nack('nd-g', [first.deliveryId], { delayMs: 1200 }), ['nacked'])
  await receiver.waitFor(2)
  const second = env(receiver.requests[1])
  // nackAt is taken before the call, so the broker's delay cannot end before nackAt + 1200.
  t.ok(
    times[1]! - nackAt >= 1200 - 2,
    `not pushed again during the delay, the 100 ms backoff did not apply: ${times[1]! - nackAt} ms after the nack (≥ 1200)`,
  )
  t.ok(times[1]! - nackAt < 1200 + 3000, 'and not much later')
  t.equal(second.attempt, 2, 'the nack counted as attempt 1')
  t.not(second.deliveryId, first.deliveryId)
  t.equal(receiver.requests[1]!.headers['webhook-id'], receiver.requests[0]!.headers['webhook-id'])
  t.same(await ack('nd-g', [second.deliveryId]), ['acked'])
  await waitUntil(
    async () => {
      const rows = await attemptRows('nd-g')
      return rows.length === 2 && rows[0].outcome === 'nacked' && rows[1].outcome === 'acked'
    },
    30_000,
    'attempt rows nacked, acked',
  )
})

t.test('nack without delayMs: pushed again after the backoff; it counts toward maxDeliveries', async (t) => {
  const { receiver, times } = await setup(t, 'nb', {
    ackTimeoutMs: 30_000,
    maxDeliveries: 2,
    retry: { initialDelayMs: 600, multiplier: 2, maxDelayMs: 5000, jitter: 0 },
  })
  await produce('nb', [{ value: 'x' }])
  await receiver.waitFor(1)
  const nackAt = Date.now()
  t.same(await nack('nb-g', [env(receiver.requests[0]).deliveryId]), ['nacked'])
  await receiver.waitFor(2)
  const gap = times[1]! - nackAt
  t.ok(gap >= 600 - 2 && gap < 600 + 3000, `pushed again after the 600 ms backoff (${gap} ms)`)
  t.equal(env(receiver.requests[1]).attempt, 2)
  // Second nack: maxDeliveries (2) reached, so it is dead (no dead-letter topic: recorded as dead).
  t.same(await nack('nb-g', [env(receiver.requests[1]).deliveryId]), ['nacked'])
  await waitUntil(
    async () => {
      const p = (await groupStatus('nb-g')).partitions[0]
      return p.committedOffset === 1 && p.inFlight === 0
    },
    30_000,
    'the dead message completed and forgotten',
  )
  // Nothing is outstanding, so nothing can be pushed again: no third attempt.
  t.equal(receiver.requests.length, 2, 'no third attempt')
  // The second attempt ends "dead" (the nack found maxDeliveries reached). The attempt log writes
  // within its flush delay, so the row may still read "in_flight" or "nacked" for a moment after the
  // completion: wait for an outcome that is final.
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('nb-g')
      return r.length === 2 && !['in_flight', 'nacked'].includes(r[1].outcome) ? r : undefined
    },
    30_000,
    "the second attempt's final outcome",
  )
  t.same(
    rows.map((r) => r.outcome),
    ['nacked', 'dead'],
    'attempt rows: nacked, then dead',
  )
})

t.test('nack with deadLetter: true goes to the dead-letter topic at once and completes the message', async (t) => {
  await call('PUT', '/v1/topics/nq.dlq', { partitions: 1 })
  // A backoff and a deadline far beyond the wait below: a dead letter that came after either would
  // fail the wait, however slow the machine, and one that comes at once passes it.
  const { receiver } = await setup(t, 'nq', {
    ackTimeoutMs: 600_000,
    maxDeliveries: 5,
    deadLetterTopic: 'nq.dlq',
    retry: { initialDelayMs: 300_000, maxDelayMs: 300_000, jitter: 0 },
  })
  await produce('nq', [{ value: { order: 7 }, key: 'k7', headers: { a: 'b' } }])
  await receiver.waitFor(1)
  const id = env(receiver.requests[0]).deliveryId
  const started = Date.now()
  t.same(await nack('nq-g', [id], { deadLetter: true }), ['nacked'])
  const dlq = await waitUntil(
    async () => {
      const m = (await call('GET', '/v1/topics/nq.dlq/partitions/0/messages')).json.messages
      return m.length > 0 ? m : undefined
    },
    30_000,
    'the dead letter',
  )
  t.ok(Date.now() - started < 300_000, `dead-lettered at once, not after the 300 s backoff (${Date.now() - started} ms)`)
  t.equal(dlq.length, 1)
  t.match(dlq[0], {
    key: 'k7',
    value: { order: 7 },
    headers: {
      a: 'b',
      'hookq-dlq-topic': 'nq',
      'hookq-dlq-partition': '0',
      'hookq-dlq-offset': '0',
      'hookq-dlq-group': 'nq-g',
      'hookq-dlq-attempts': '1',
    },
  })
  t.match((await groupStatus('nq-g')).partitions[0], { committedOffset: 1, lag: 0, inFlight: 0 }, 'completed for the group')
  t.same(await ack('nq-g', [id]), ['already_completed'], 'an ack afterwards: already completed')
  t.same(await nack('nq-g', [id]), ['already_completed'], 'a nack afterwards: already completed')
  t.match((await groupStatus('nq-g')).partitions[0], { committedOffset: 1, inFlight: 0 }, 'and nothing outstanding after them')
  t.equal(receiver.requests.length, 1, 'never pushed again')
})

t.test('ids of another group, and ids never issued, are unknown to ack, nack and extend (in memory and after completion)', async (t) => {
  t.equal((await call('PUT', '/v1/topics/nf', { partitions: 1 })).status, 201)
  const ra = await startReceiver(t)
  const rb = await startReceiver(t)
  for (const [g, r] of [
    ['nf-a', ra],
    ['nf-b', rb],
  ] as const) {
    // A 100 ms backoff: a nack wrongly applied here would push again well inside the window below.
    await call('PUT', `/v1/groups/${g}`, { topic: 'nf', ackTimeoutMs: 30_000, retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 } })
    await call('POST', `/v1/groups/${g}/consumers`, { url: r.url })
  }
  await produce('nf', [{ value: 'shared' }])
  await ra.waitFor(1)
  await rb.waitFor(1)
  const aId = env(ra.requests[0]).deliveryId
  const bId = env(rb.requests[0]).deliveryId
  const never = 'AAAAAAAAAAAAAAAAAAAAAA'
  t.same(await ack('nf-b', [aId, never]), ['unknown', 'unknown'], "ack of group a's id through group b")
  t.same(await nack('nf-b', [aId, never]), ['unknown', 'unknown'], "nack of group a's id through group b")
  t.same(await extend('nf-b', [aId, never], 5000), ['unknown', 'unknown'], "extend of group a's id through group b")
  t.match((await groupStatus('nf-a')).partitions[0], { committedOffset: 0, inFlight: 1 }, "group a's message is untouched")
  t.match((await groupStatus('nf-b')).partitions[0], { committedOffset: 0, inFlight: 1 }, "group b's message is untouched")
  await absenceWindow(600) // absence: no push from the foreign nack (one applied would come after the 100 ms backoff)
  t.equal(ra.requests.length + rb.requests.length, 2, 'the foreign nack did not cause a push anywhere')

  t.same(await ack('nf-a', [aId]), ['acked'])
  // Group a's id is no longer in memory now: the lookup goes to the attempt log.
  t.same(await ack('nf-b', [aId]), ['unknown'], 'a completed id of group a is still unknown to group b')
  t.same(await nack('nf-b', [aId]), ['unknown'])
  t.same(await ack('nf-b', [bId]), ['acked'], 'group b acks its own')
  t.same(await ack('nf-a', [bId]), ['unknown'], "and group b's id is unknown to group a")
})

t.test('a nack or extend of a superseded delivery id does not touch the current attempt', async (t) => {
  const { receiver } = await setup(t, 'ns', {
    ackTimeoutMs: 1000,
    pushTimeoutMs: 500,
    retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
  })
  // Attempt 2 extends its own deadline as it arrives, so what follows has all the time it needs
  // however slow the machine (its 1 s deadline would otherwise push attempt 3 of its own accord).
  const extended: Promise<Status[]>[] = []
  receiver.setBehaviour((req) => {
    if (env(req).attempt === 2) extended.push(extend('ns-g', [env(req).deliveryId], 30_000))
    return { status: 200 }
  })
  await produce('ns', [{ value: 'x' }])
  await receiver.waitFor(2) // attempt 1 not acked: redelivered after its deadline
  const [a, b] = [env(receiver.requests[0]), env(receiver.requests[1])]
  t.equal(b.attempt, 2)
  t.same(await extended[0], ['extended'], 'attempt 2 extended itself')
  // Only the current attempt can be nacked or extended; attempt 1's id names a settled attempt.
  t.same(await nack('ns-g', [a.deliveryId], { delayMs: 0 }), ['already_completed'], "nack of attempt 1's id: no effect")
  t.same(await extend('ns-g', [a.deliveryId], 60_000), ['already_completed'], "extend of attempt 1's id: no effect")
  await absenceWindow(600) // absence: a stale nack applied (delay 0) would push attempt 3 at once
  t.equal(receiver.requests.length, 2, 'no extra push from the stale nack')
  t.same(await ack('ns-g', [b.deliveryId]), ['acked'], 'the current attempt is still ackable')
  t.match((await groupStatus('ns-g')).partitions[0], { committedOffset: 1, inFlight: 0 })
})

t.test('extend keeps a message from being redelivered past its original deadline', async (t) => {
  const { receiver, times } = await setup(t, 'ne', {
    ackTimeoutMs: 1000,
    pushTimeoutMs: 500,
    retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
  })
  // Attempt 1 is extended as it arrives, well before its 1 s deadline however slow the machine;
  // the call's start and end bound the deadline the broker sets.
  let extendSent = 0
  let extendAnswered = 0
  const extended: Promise<Status[]>[] = []
  receiver.setBehaviour((req) => {
    times.push(Date.now())
    if (env(req).attempt === 1) {
      extendSent = Date.now()
      extended.push(
        extend('ne-g', [env(req).deliveryId], 2500).then((s) => {
          extendAnswered = Date.now()
          return s
        }),
      )
    }
    return { status: 200 }
  })
  const producedAt = Date.now()
  await produce('ne', [{ value: 'x' }])
  await receiver.waitFor(1)
  const first = env(receiver.requests[0])
  const t0 = times[0]!
  const originalDeadline = Date.parse(first.ackDeadline)
  // The push started after the produce call did and before it arrived (ISO times: whole ms).
  t.ok(
    originalDeadline >= producedAt + 1000 - 1 && originalDeadline <= t0 + 1000,
    `the envelope names the 1 s deadline (${originalDeadline - producedAt} ms after the produce call, ${t0 + 1000 - originalDeadline} ms before arrival + 1 s)`,
  )
  t.same(await extended[0], ['extended'])
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('ne-g')
      return r.length === 1 && r[0].ack_deadline && new Date(r[0].ack_deadline).getTime() > originalDeadline ? r : undefined
    },
    30_000,
    'the attempt row carries the new deadline',
  )
  const newDeadline = new Date(rows[0].ack_deadline).getTime()
  t.ok(newDeadline >= extendSent + 2500 - 1 && newDeadline <= extendAnswered + 2500, 'the new deadline is 2.5 s after the extend call')
  // Not acked: redelivered after the extended deadline, not at the original one.
  await receiver.waitFor(2)
  t.ok(times[1]! >= extendSent + 2500, `redelivered ${times[1]! - extendSent} ms after the extend (≥ 2500), not at the original deadline`)
  t.equal(env(receiver.requests[1]).attempt, 2)
  t.same(await extend('ne-g', ['BBBBBBBBBBBBBBBBBBBBBB'], 1000), ['unknown'], 'extend of an unknown id')
  t.same(await ack('ne-g', [env(receiver.requests[1]).deliveryId]), ['acked'])
})

t.test('concurrent duplicate acks of one id: exactly one acked, the rest already_completed', async (t) => {
  const { receiver } = await setup(t, 'nc', { ackTimeoutMs: 30_000 })
  await produce(
    'nc',
    [1, 2, 3, 4, 5].map((v) => ({ value: v })),
  )
  await receiver.waitFor(5)
  for (const r of receiver.requests) {
    const id = env(r).deliveryId
    const all = await Promise.all(Array.from({ length: 10 }, () => ack('nc-g', [id])))
    const flat = all.flat()
    t.equal(flat.filter((s) => s === 'acked').length, 1, `offset ${env(r).offset}: one acked`)
    t.equal(flat.filter((s) => s === 'already_completed').length, 9, `offset ${env(r).offset}: nine already_completed`)
  }
  // One request carrying the same id ten times behaves the same way.
  await produce('nc', [{ value: 6 }])
  await receiver.waitFor(6)
  const id6 = env(receiver.requests[5]).deliveryId
  const one = await ack(
    'nc-g',
    Array.from({ length: 10 }, () => id6),
  )
  t.same(one, ['acked', ...Array.from({ length: 9 }, () => 'already_completed')])
  t.match((await groupStatus('nc-g')).partitions[0], { committedOffset: 6, lag: 0, inFlight: 0 })
})

t.test('an ack answered 200 is durable: group_completions and group_offsets hold it at once', async (t) => {
  const { receiver } = await setup(t, 'nu', { ackTimeoutMs: 30_000 })
  await produce('nu', [{ value: 0 }, { value: 1 }, { value: 2 }])
  await receiver.waitFor(3)
  const byOffset = new Map(receiver.requests.map((r) => [env(r).offset, env(r).deliveryId]))
  const [{ id: groupId }] = await sql(`SELECT id FROM consumer_groups WHERE name = 'nu-g'`)
  const committed = async () =>
    (await sql(`SELECT committed_offset::int AS c FROM group_offsets WHERE group_id = $1 AND partition = 0`, [groupId]))[0]?.c
  const completions = async () =>
    (await sql(`SELECT "offset"::int AS o FROM group_completions WHERE group_id = $1 ORDER BY 1`, [groupId])).map((r) => r.o)

  t.same(await ack('nu-g', [byOffset.get(2)!]), ['acked'])
  t.same(await completions(), [2], 'out-of-order completion stored before the answer')
  t.equal(await committed(), 0)
  t.same(await ack('nu-g', [byOffset.get(0)!]), ['acked'])
  t.equal(await committed(), 1, 'committed offset moved before the answer')
  t.same(await ack('nu-g', [byOffset.get(1)!]), ['acked'])
  t.equal(await committed(), 3, 'committed offset passes the remembered completion')
  t.same(await completions(), [], 'completions below the committed offset are gone')
})

t.test('a late ack of attempt 1 while attempt 2 is out completes the message; no attempt row stays in_flight', async (t) => {
  const { receiver } = await setup(t, 'nl', {
    ackTimeoutMs: 1000,
    pushTimeoutMs: 500,
    retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
  })
  await produce('nl', [{ value: 'x' }])
  await receiver.waitFor(2)
  t.same(await ack('nl-g', [env(receiver.requests[0]).deliveryId]), ['acked'])
  t.same(await ack('nl-g', [env(receiver.requests[1]).deliveryId]), ['already_completed'])
  await waitUntil(
    async () => {
      const rows = await attemptRows('nl-g')
      return rows.length === 2 && rows.every((r) => r.outcome !== 'in_flight')
    },
    30_000,
    'every attempt row has a final outcome',
  ).then(
    () => t.pass('final outcomes'),
    (err: Error) => t.fail(err.message),
  )
  // The message is completed and forgotten: attempt 2's deadline has nothing left to push again.
  t.match((await groupStatus('nl-g')).partitions[0], { committedOffset: 1, inFlight: 0 }, 'nothing outstanding')
  t.equal(receiver.requests.length, 2, "attempt 2's deadline does not push again")
})

t.test('an ack sent from inside the handler before its answer completes the message; a 500 answer after it changes nothing', async (t) => {
  t.equal((await call('PUT', '/v1/topics/nh', { partitions: 1 })).status, 201)
  t.equal(
    // Deadlines far off: the answer waits for the ack, however long that takes here.
    (
      await call('PUT', '/v1/groups/nh-g', {
        topic: 'nh',
        ackTimeoutMs: 30_000,
        pushTimeoutMs: 10_000,
        retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
      })
    ).status,
    201,
  )
  const early: Promise<Status[]>[] = []
  const receiver = await startReceiver(t, (req) => {
    const acked = ack('nh-g', [env(req).deliveryId])
    early.push(acked)
    return { status: 500, body: 'answered after acking', after: acked }
  })
  await call('POST', '/v1/groups/nh-g/consumers', { url: receiver.url })
  await produce('nh', [{ value: 'x' }])
  await receiver.waitFor(1)
  t.same(await early[0], ['acked'])
  // The 500 answered after the ack is recorded on the attempt, which keeps its outcome.
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('nh-g')
      return r.length === 1 && r[0].status_code !== null ? r : undefined
    },
    30_000,
    "the 500 answer on the attempt's row",
  )
  t.match(rows[0], { outcome: 'acked', status_code: 500 }, 'the attempt keeps its acked outcome, with the 500 it answered')
  // Nothing outstanding after the answer: no deadline or retry is left to push it again.
  t.match((await groupStatus('nh-g')).partitions[0], { committedOffset: 1, inFlight: 0 })
  t.equal(receiver.requests.length, 1, 'not pushed again')
})

t.test('a nack sent from inside the handler before a 200 answer still counts: pushed again', async (t) => {
  t.equal((await call('PUT', '/v1/topics/nk', { partitions: 1 })).status, 201)
  t.equal(
    (
      await call('PUT', '/v1/groups/nk-g', {
        topic: 'nk',
        ackTimeoutMs: 30_000,
        retry: { initialDelayMs: 100, maxDelayMs: 100, jitter: 0 },
      })
    ).status,
    201,
  )
  const early: Promise<Status[]>[] = []
  const receiver = await startReceiver(t, (req) => {
    if (env(req).attempt !== 1) return { status: 200 }
    const nacked = nack('nk-g', [env(req).deliveryId], { delayMs: 200 })
    early.push(nacked)
    return { status: 200, after: nacked }
  })
  await call('POST', '/v1/groups/nk-g/consumers', { url: receiver.url })
  await produce('nk', [{ value: 'x' }])
  await receiver.waitFor(2)
  t.same(await early[0], ['nacked'])
  t.equal(env(receiver.requests[1]).attempt, 2)
  t.same(await ack('nk-g', [env(receiver.requests[1]).deliveryId]), ['acked'])
  await waitUntil(
    async () => {
      const rows = await attemptRows('nk-g')
      return rows.length === 2 && rows[0].outcome === 'nacked' && rows[1].outcome === 'acked'
    },
    30_000,
    'rows nacked, acked',
  )
})

t.test('a nack sent before its push is answered: the dead letter carries the answer\'s error, not just "nacked"', async (t) => {
  // As the consumer helper does in explicit mode: nack the delivery, then answer 500 with the cause.
  t.equal((await call('PUT', '/v1/topics/nr.dlq', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/topics/nr', { partitions: 1 })).status, 201)
  t.equal((await call('PUT', '/v1/groups/nr-g', { topic: 'nr', maxDeliveries: 1, deadLetterTopic: 'nr.dlq' })).status, 201)
  const nacks: Promise<Status[]>[] = []
  const receiver = await startReceiver(t, (req) => {
    const nacked = nack('nr-g', [env(req).deliveryId])
    nacks.push(nacked)
    return { after: nacked, status: 500, body: '{"error":"handler_failed","detail":"the card was declined"}' }
  })
  t.equal((await call('POST', '/v1/groups/nr-g/consumers', { url: receiver.url })).status, 201)
  await produce('nr', [{ value: 'order-1' }])
  await receiver.waitFor(1)
  await waitUntil(async () => (await groupStatus('nr-g')).partitions[0].lag === 0, 30_000, 'dead-lettered')
  t.same(await nacks[0], ['nacked'])
  const dead = (await call('GET', '/v1/topics/nr.dlq/partitions/0/messages?fromOffset=0&limit=10')).json.messages
  t.equal(dead.length, 1)
  const error = dead[0].headers['hookq-dlq-error'] as string
  t.match(error, /^nacked: HTTP 500: .*the card was declined/, `hookq-dlq-error: ${error}`)
  // The attempt log writes within its flush delay, after the completion: the row's last outcome may come a moment later.
  const rows = await waitUntil(
    async () => {
      const r = await attemptRows('nr-g')
      return r.length === 1 && r[0].outcome === 'dead' ? r : undefined
    },
    30_000,
    'the attempt row marked dead',
  )
  // The last attempt's row is marked dead (how a dead letter without a topic is recorded), and keeps the answer.
  t.match(rows[0], { outcome: 'dead', status_code: 500, error: /the card was declined/ }, 'the attempt row keeps the answer')
})

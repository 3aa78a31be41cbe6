/**
 * What the push tests share: the envelope a push carries, a receiver that notes arrival times, a
 * topic + group + consumer set up through the API, and the attempt log (the deliveries table) read
 * back. One place, so that a change to the envelope or the table is one change here.
 */
import type { ApiAnswer } from './api.ts'
import { startReceiver, type BehaviourSpec, type Received, type Receiver } from './receiver.ts'

/** The JSON body of a single push (src/dispatch/envelope.ts builds it); batch pushes carry `deliveries: Envelope[]`. */
export interface Envelope {
  deliveryId: string
  partition: number
  offset: number
  attempt: number
  value: unknown
  key?: string | null
  headers: Record<string, string>
  ackDeadline: string
  traceparent?: string
  tracestate?: string
}

/** The envelope a request carried (the test fails with a TypeError when there was no request). */
export const env = (r: Received | undefined): Envelope => r!.json as Envelope

/** What the helpers need of a tap test. */
export interface TT {
  equal(found: unknown, wanted: unknown): boolean
  teardown(fn: () => unknown): void
}

/** The API call of `api(broker)` (test/helpers/api.ts). */
type Call = (method: string, url: string, payload?: unknown) => Promise<ApiAnswer>

/**
 * A receiver whose behaviour may depend on the request's number (1-based), and the time each
 * request arrived (times[i] belongs to requests[i]).
 */
export async function timedReceiver(
  tt: TT,
  behave: (req: Received, n: number) => BehaviourSpec = () => ({ status: 200 }),
): Promise<{ receiver: Receiver; times: number[] }> {
  const times: number[] = []
  const receiver = await startReceiver(tt, (req) => {
    times.push(Date.now())
    return behave(req, times.length)
  })
  return { receiver, times }
}

/** Creates topic `name` and group `${name}-g` on it (each answered 201, checked on `tt`). */
export async function topicAndGroup(call: Call, tt: TT, name: string, group: object, partitions = 1): Promise<void> {
  tt.equal((await call('PUT', `/v1/topics/${name}`, { partitions })).status, 201)
  tt.equal((await call('PUT', `/v1/groups/${name}-g`, { topic: name, ...group })).status, 201)
}

/** Adds a consumer to `group`; its id. Throws unless answered 201. */
export async function addConsumer(call: Call, group: string, url: string, extra: object = {}): Promise<string> {
  const res = await call('POST', `/v1/groups/${group}/consumers`, { url, ...extra })
  if (res.status !== 201) throw new Error(`add consumer: ${res.status} ${JSON.stringify(res.json)}`)
  return res.json.id as string
}

/** Topic + group + one consumer on a timed receiver answering as `behave` says; the receiver and its times. */
export async function groupWithReceiver(
  call: Call,
  tt: TT,
  name: string,
  group: object,
  opts: { partitions?: number; behave?: (req: Received, n: number) => BehaviourSpec } = {},
): Promise<{ receiver: Receiver; times: number[]; consumerId: string }> {
  await topicAndGroup(call, tt, name, group, opts.partitions ?? 1)
  const r = await timedReceiver(tt, opts.behave)
  const consumerId = await addConsumer(call, `${name}-g`, r.receiver.url)
  return { ...r, consumerId }
}

/**
 * The attempt log (the deliveries table) of group `group` (by name), in partition, offset, attempt
 * order: id, partition, offset, attempt, outcome (as text), error, status_code, consumer_id,
 * ack_deadline. Rows as loosely typed as the API's answers (ApiAnswer.json): a test reads what it checks.
 */
export function attemptRows(sql: (text: string, params?: unknown[]) => Promise<any[]>, group: string): Promise<any[]> {
  return sql(
    `SELECT d.id, d.partition, d."offset"::int AS "offset", d.attempt, d.outcome::text AS outcome, d.error, d.status_code,
            d.consumer_id, d.ack_deadline
       FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id WHERE g.name = $1
      ORDER BY d.partition, d."offset", d.attempt`,
    [group],
  )
}

/** The helpers above bound to one broker's `api(broker)` (test/helpers/api.ts). */
export function pushGroups(a: { call: Call; sql: (text: string, params?: unknown[]) => Promise<any[]> }) {
  return {
    topicAndGroup: (tt: TT, name: string, group: object, partitions = 1) => topicAndGroup(a.call, tt, name, group, partitions),
    addConsumer: (group: string, url: string, extra: object = {}) => addConsumer(a.call, group, url, extra),
    groupWithReceiver: (tt: TT, name: string, group: object, opts: Parameters<typeof groupWithReceiver>[4] = {}) =>
      groupWithReceiver(a.call, tt, name, group, opts),
    attemptRows: (group: string) => attemptRows(a.sql, group),
  }
}

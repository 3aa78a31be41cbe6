/** Short calls to an in-process broker's API (through inject) and its database, for tests. */
import type { Broker } from '../../src/broker.ts'
import { waitUntil } from './wait.ts'

export interface ApiAnswer {
  status: number
  // Tests read whatever shape the route answers.
  json: any
}

/** Helpers bound to one broker. */
export function api(broker: Broker) {
  const app = broker.app
  const call = async (method: string, url: string, payload?: unknown): Promise<ApiAnswer> => {
    const res = await app.inject({ method: method as 'GET', url, ...(payload === undefined ? {} : { payload: payload as object }) })
    return { status: res.statusCode, json: res.body ? res.json() : undefined }
  }
  const produce = (topic: string, messages: unknown[]) => call('POST', `/v1/topics/${topic}/messages`, { messages })
  const sql = async (text: string, params: unknown[] = []) => (await broker.db.pool.query(text, params)).rows
  const groupStatus = async (group: string) => (await call('GET', `/v1/groups/${group}`)).json
  /** Waits until every partition of the group has lag 0. */
  const allCompleted = (group: string, timeoutMs = 30_000) =>
    waitUntil(
      async () => (await groupStatus(group)).partitions.every((p: { lag: number }) => p.lag === 0),
      timeoutMs,
      `${group}: everything completed`,
    )
  /** Acks delivery ids; the statuses, in order. */
  const ack = async (group: string, ids: string[]): Promise<string[]> =>
    (await call('POST', `/v1/groups/${group}/acks`, { deliveryIds: ids })).json.results.map((r: { status: string }) => r.status)
  return { app, call, produce, sql, groupStatus, allCompleted, ack }
}

// @ts-check
/**
 * The console's client of the public /v1 API: same origin, JSON in and out, the API key from
 * sessionStorage as `Authorization: Bearer`, and problem documents turned into ApiError.
 * A 401 also tells the app (onKeyRequired) so it can ask for a key.
 */

/**
 * @typedef {{ type?: string, title?: string, status?: number, detail?: string, code?: string,
 *   errors?: { path: string, message: string }[] }} Problem
 * @typedef {{ name: string, partitions: number, retentionMs: number, createdAt: string }} Topic
 * @typedef {{ messages: number, oldestMessageAt: string | null, approxBytes: number }} TopicStorage
 * @typedef {Topic & { partitionStats: { partition: number, endOffset: number, startOffset?: number }[],
 *   storage?: TopicStorage }} TopicDetail
 * @typedef {{ partition: number, offset: number, key: string | null, value: unknown,
 *   headers: Record<string, string>, timestamp: string }} Message
 * @typedef {{ name: string, topic: string, delivery: 'push' | 'pull', ackMode: 'explicit' | 'auto', ackTimeoutMs: number, maxDeliveries: number,
 *   retry: { initialDelayMs: number, multiplier: number, maxDelayMs: number, jitter: number },
 *   deadLetterTopic: string | null, startAt: string, maxInFlight: number, ordered: boolean,
 *   ordering: 'none' | 'partition' | 'key', pushTimeoutMs: number,
 *   pushFormat: 'envelope' | 'raw', paused: boolean, filter: Record<string, unknown> | null,
 *   batch: { maxMessages: number, maxWaitMs: number, maxBytes: number | null } | null, createdAt: string, updatedAt: string }} Group
 * @typedef {{ partition: number, committedOffset: number, endOffset: number, lag: number, inFlight: number,
 *   consumerId: string | null, filtered: number }} PartitionStatus
 * @typedef {{ id: string, url: string, createdAt: string, disabled?: boolean, disabledReason?: string | null,
 *   hasSecret?: boolean, auth?: PushAuthView, rateLimitPerSecond: number | null, maxConcurrency: number | null }} Consumer
 * @typedef {{ type: 'headers', headerNames: string[] } | { type: 'jwt', audience: string | null }
 *   | { type: 'oauth2', tokenUrl: string, clientId: string, scope: string | null } | null} PushAuthView
 * @typedef {{ lastSuccessAt: string | null, lastFailureAt: string | null, lastError: string | null,
 *   recentFailureRate: number | null }} ConsumerHealth
 * @typedef {Group & { partitions: PartitionStatus[], consumers: (Consumer & { health: ConsumerHealth })[] }} GroupStatus
 * @typedef {'acked' | 'failed' | 'timed_out' | 'nacked' | 'dead' | 'in_flight'} Outcome
 * @typedef {{ deliveryId: string, partition: number, offset: number, attempt: number, consumerId: string | null,
 *   startedAt: string, finishedAt: string | null, statusCode: number | null, error: string | null,
 *   outcome: Outcome, durationMs: number | null }} Delivery
 * @typedef {{ value: unknown, key?: string, headers?: Record<string, string>, partition?: number,
 *   idempotencyKey?: string }} ProduceMessage
 * @typedef {{ partition: number, offset: number, duplicate?: boolean }} ProduceResult
 * @typedef {{ value: unknown, key?: string, headers?: Record<string, string> }} ScheduleMessage
 * @typedef {{ topic: string, cron?: string, every?: number, timeZone?: string, message: ScheduleMessage,
 *   paused?: boolean, missed?: 'skip' | 'once' }} ScheduleConfig
 * @typedef {{ name: string, topic: string, cron?: string, every?: number, timeZone: string, message: ScheduleMessage,
 *   paused: boolean, missed: 'skip' | 'once', nextRuns: string[], lastTickAt: string | null, createdAt: string,
 *   updatedAt: string }} Schedule
 */

const KEY_STORAGE = 'hookq.apiKey'

/** A non-2xx answer, with the problem document when the broker sent one. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {Problem} problem
   */
  constructor(status, problem) {
    super(describeProblem(status, problem))
    this.name = 'ApiError'
    this.status = status
    this.problem = problem
  }
}

/**
 * One readable line for a problem document: title, detail and the per-field errors.
 * @param {number} status
 * @param {Problem} problem
 */
export function describeProblem(status, problem) {
  const head = `${problem.title ?? 'Request failed'} (${status}${problem.code ? `, ${problem.code}` : ''})`
  const detail = problem.detail && problem.detail !== problem.title ? `: ${problem.detail}` : ''
  return head + detail
}

/** The key this tab uses, or null. sessionStorage: it goes when the tab closes. */
export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE)
}

/** @param {string} key */
export function setKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key)
}

export function clearKey() {
  sessionStorage.removeItem(KEY_STORAGE)
}

/** @type {() => void} */
let keyRequired = () => {}

/**
 * Registers what to do when a call is answered 401 (the app shows the key form).
 * @param {() => void} fn
 */
export function onKeyRequired(fn) {
  keyRequired = fn
}

/**
 * One API call. Query values that are undefined or '' are left out.
 * @param {string} method
 * @param {string} path
 * @param {{ query?: Record<string, string | number | undefined>, body?: unknown }} [opts]
 * @returns {Promise<any>}
 */
export async function request(method, path, opts = {}) {
  const params = new URLSearchParams()
  for (const [k, v] of Object.entries(opts.query ?? {})) if (v !== undefined && v !== '') params.set(k, String(v))
  const url = params.size > 0 ? `${path}?${params}` : path
  /** @type {Record<string, string>} */
  const headers = { accept: 'application/json' }
  const key = getKey()
  if (key) headers.authorization = `Bearer ${key}`
  if (opts.body !== undefined) headers['content-type'] = 'application/json'
  const res = await fetch(url, {
    method,
    headers,
    ...(opts.body === undefined ? {} : { body: JSON.stringify(opts.body) }),
  })
  if (res.status === 204) return null
  const text = await res.text()
  /** @type {any} */
  let data = null
  try {
    data = text ? JSON.parse(text) : null
  } catch {
    data = { title: text.slice(0, 200) }
  }
  if (!res.ok) {
    if (res.status === 401) keyRequired()
    throw new ApiError(res.status, data && typeof data === 'object' ? data : {})
  }
  return data
}

const enc = encodeURIComponent

/** The calls the console makes, named after what they return. */
export const api = {
  /** @returns {Promise<Topic[]>} */
  topics: async () => (await request('GET', '/v1/topics')).topics,
  /** @param {string} name @returns {Promise<TopicDetail>} */
  topic: (name) => request('GET', `/v1/topics/${enc(name)}`),
  /**
   * @param {string} topic @param {number} partition @param {number} fromOffset @param {number} limit
   * @returns {Promise<{ messages: Message[], nextOffset: number }>}
   */
  messages: (topic, partition, fromOffset, limit) =>
    request('GET', `/v1/topics/${enc(topic)}/partitions/${partition}/messages`, { query: { fromOffset, limit } }),
  /** @param {string} topic @param {ProduceMessage[]} messages @returns {Promise<{ results: ProduceResult[] }>} */
  produce: (topic, messages) => request('POST', `/v1/topics/${enc(topic)}/messages`, { body: { messages } }),
  /** @returns {Promise<Group[]>} */
  groups: async () => (await request('GET', '/v1/groups')).groups,
  /** @param {string} name @returns {Promise<GroupStatus>} */
  group: (name) => request('GET', `/v1/groups/${enc(name)}`),
  /** @param {string} name @param {{ topic: string, paused: boolean }} body @returns {Promise<Group>} */
  putGroup: (name, body) => request('PUT', `/v1/groups/${enc(name)}`, { body }),
  /**
   * @param {string} name @param {{ partition?: number, offset?: number, timestamp?: string }} body
   * @returns {Promise<{ partitions: { partition: number, committedOffset: number }[] }>}
   */
  seek: (name, body) => request('POST', `/v1/groups/${enc(name)}/seek`, { body }),
  /**
   * @param {string} name
   * @param {{ partition?: number, offset?: number, outcome?: string, limit?: number, cursor?: string }} query
   * @returns {Promise<{ deliveries: Delivery[], nextCursor: string | null }>}
   */
  deliveries: (name, query) => request('GET', `/v1/groups/${enc(name)}/deliveries`, { query }),
  /** @returns {Promise<Schedule[]>} */
  schedules: async () => (await request('GET', '/v1/schedules')).schedules,
  /** @param {string} name @param {ScheduleConfig} body @returns {Promise<Schedule>} */
  putSchedule: (name, body) => request('PUT', `/v1/schedules/${enc(name)}`, { body }),
}

/**
 * The hookq client: openapi-fetch over the types generated from openapi/openapi.json
 * (src/schema.ts, `npm run sdk:gen`). Every route of the contract is typed: paths, parameters,
 * bodies and answers, including the problem documents of the error answers.
 *
 *   const hookq = createClient({ baseUrl: 'http://127.0.0.1:8080', apiKey: process.env.HOOKQ_API_KEY })
 *   const { data, error } = await hookq.POST('/v1/topics/{topic}/messages', {
 *     params: { path: { topic: 'orders' } }, body: { messages: [{ value: { id: 1 } }] } })
 *
 * `unwrap` turns the `{ data, error }` pair into a value or a thrown HookqError, for code that
 * prefers exceptions.
 */
import createFetchClient, { type Client, type ClientOptions } from 'openapi-fetch'
import type { components, paths } from './schema.ts'

export type { paths, components, operations } from './schema.ts'

type Schemas = components['schemas']
export type Topic = Schemas['Topic']
export type TopicDetail = Schemas['TopicDetail']
export type Message = Schemas['Message']
export type ProduceMessage = Schemas['ProduceMessage']
export type ProduceResult = Schemas['ProduceResult']
export type Group = Schemas['Group']
export type GroupConfig = Schemas['GroupConfig']
export type GroupStatus = Schemas['GroupStatus']
export type PartitionStatus = Schemas['PartitionStatus']
export type Consumer = Schemas['Consumer']
export type Delivery = Schemas['Delivery']
export type AckResult = Schemas['AckResult']
export type Problem = Schemas['Problem']
export type Key = Schemas['Key']
export type KeyScope = Schemas['KeyScope']
export type CreatedKey = Schemas['CreatedKey']
export type Schedule = Schemas['Schedule']
export type ScheduleConfig = Schemas['ScheduleConfig']

// JSON answers and the problem+json error documents both count as the body type.
export type HookqClient = Client<paths, `${string}/${string}json`>

export interface HookqClientOptions extends Omit<ClientOptions, 'baseUrl'> {
  /** Where the broker listens; default `HOOKQ_URL`, then http://127.0.0.1:8080. */
  baseUrl?: string
  /** Sent as `Authorization: Bearer <key>` when set; default `HOOKQ_API_KEY`. */
  apiKey?: string
}

export const DEFAULT_URL = 'http://127.0.0.1:8080'

export function createClient(options: HookqClientOptions = {}): HookqClient {
  const { apiKey = env('HOOKQ_API_KEY'), baseUrl = env('HOOKQ_URL') ?? DEFAULT_URL, headers, ...rest } = options
  return createFetchClient<paths, `${string}/${string}json`>({
    ...rest,
    baseUrl: baseUrl.replace(/\/+$/, ''),
    headers: apiKey === undefined || apiKey === '' ? headers : { authorization: `Bearer ${apiKey}`, ...headers },
  })
}

/** An error answer of the broker, with its RFC 9457 problem document. */
export class HookqError extends Error {
  readonly status: number
  readonly code: string | undefined
  readonly problem: Partial<Problem> & Record<string, unknown>
  readonly retryAfterSeconds: number | undefined

  constructor(status: number, problem: unknown, retryAfter: string | null) {
    const p = (typeof problem === 'object' && problem !== null ? problem : { detail: String(problem) }) as HookqError['problem']
    super(`${status} ${p.code ?? p.title ?? 'error'}: ${p.detail ?? p.title ?? 'request failed'}`)
    this.name = 'HookqError'
    this.status = status
    this.code = typeof p.code === 'string' ? p.code : undefined
    this.problem = p
    const seconds = retryAfter === null ? NaN : Number(retryAfter)
    this.retryAfterSeconds = Number.isFinite(seconds) ? seconds : undefined
  }
}

/** The data of a successful answer, or a thrown HookqError. */
export async function unwrap<T>(call: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  const { data, error, response } = await call
  if (!response.ok || error !== undefined) throw new HookqError(response.status, error, response.headers.get('retry-after'))
  return data as T
}

function env(name: string): string | undefined {
  const value = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name]
  return value === '' ? undefined : value
}

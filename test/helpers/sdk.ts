/**
 * For the SDK's tests (test/sdk/): the broker's API through the SDK client (topics and groups,
 * consumers, produce, the attempt log, lag), consumers served on 127.0.0.1 or run as processes of
 * their own, and a consumer's own database.
 */
import http from 'node:http'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import type { AddressInfo } from 'node:net'
import type pg from 'pg'
import { createClient, unwrap, type GroupConfig } from '@hookq/client'
import { testDatabase, type TeardownHost } from './db.ts'
import { testPool } from './pg-pool.ts'
import { EXIT_WITH_PARENT } from './process.ts'
import { waitUntil } from './wait.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))

/** A group's settings, any of them (the topic is the group's name). */
export type GroupSettings = Partial<Omit<GroupConfig, 'topic' | 'retry'>> & { retry?: Partial<GroupConfig['retry']> }

/** Helpers bound to the broker at `url`, through the SDK's client. */
export function sdkApi(url: string) {
  const hookq = createClient({ baseUrl: url })

  /** A one-partition topic and a group of the same name on it. */
  const setup = async (name: string, group: GroupSettings = {}): Promise<void> => {
    await unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic: name } }, body: { partitions: 1 } }))
    await unwrap(hookq.PUT('/v1/groups/{group}', { params: { path: { group: name } }, body: { topic: name, ...group } as GroupConfig }))
  }

  /** setup, and a consumer registered at `consumerUrl` with `secret`; the consumer's id. */
  const setupWithConsumer = async (name: string, group: GroupSettings, consumerUrl: string, secret: string): Promise<string> => {
    await setup(name, group)
    return register(name, consumerUrl, secret)
  }

  /** Registers a consumer of `group` at `consumerUrl`; its id. */
  const register = async (group: string, consumerUrl: string, secret?: string): Promise<string> => {
    const c = await unwrap(
      hookq.POST('/v1/groups/{group}/consumers', {
        params: { path: { group } },
        body: { url: consumerUrl, ...(secret ? { secret } : {}) },
      }),
    )
    return c.id
  }

  const produce = async (topic: string, messages: { value: unknown; key?: string; headers?: Record<string, string> }[]): Promise<void> => {
    await unwrap(hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic } }, body: { messages } }))
  }

  /** Produces one message per value, in order. */
  const produceValues = (topic: string, values: unknown[]): Promise<void> =>
    produce(
      topic,
      values.map((value) => ({ value })),
    )

  /** The group's partitions: committed and end offsets, lag, messages outstanding. */
  const partitions = async (group: string) => (await unwrap(hookq.GET('/v1/groups/{group}', { params: { path: { group } } }))).partitions

  /** Waits until the group has no lag and nothing outstanding: every message acked (or dead). */
  const lagZero = (group: string, timeoutMs = 30_000): Promise<unknown> =>
    waitUntil(async () => (await partitions(group)).every((p) => p.lag === 0 && p.inFlight === 0), timeoutMs, `${group}: lag 0`)

  /** The group's attempt log (its last 100 rows), oldest first. */
  const deliveries = async (group: string) =>
    (await unwrap(hookq.GET('/v1/groups/{group}/deliveries', { params: { path: { group }, query: { limit: 100 } } }))).deliveries.reverse()

  /** The attempt log once `done` holds for it: it is written in batches, a little after the acks. */
  const deliveriesWhen = (group: string, done: (log: Awaited<ReturnType<typeof deliveries>>) => boolean, timeoutMs = 20_000) =>
    waitUntil(
      async () => {
        const log = await deliveries(group)
        return done(log) ? log : undefined
      },
      timeoutMs,
      `${group}: the attempt log`,
    )

  /** Seeks partition 0 of the group back to offset 0. */
  const seekToStart = async (group: string): Promise<void> => {
    await unwrap(hookq.POST('/v1/groups/{group}/seek', { params: { path: { group } }, body: { partition: 0, offset: 0 } }))
  }

  /** An API client whose first `n` ack calls fail before reaching the broker, as a dropped connection would. */
  const droppingAcks = (n: number) => {
    let toDrop = n
    return createClient({
      baseUrl: url,
      fetch: async (request: Request) => {
        if (request.url.endsWith('/acks') && toDrop-- > 0) throw new TypeError('fetch failed: connection reset')
        return fetch(request)
      },
    })
  }

  return {
    hookq,
    setup,
    setupWithConsumer,
    register,
    produce,
    produceValues,
    partitions,
    lagZero,
    deliveries,
    deliveriesWhen,
    seekToStart,
    droppingAcks,
  }
}

/** A node:http server on 127.0.0.1:0 running `listener`; its base URL. Closed at teardown. */
export async function serve(t: TeardownHost, listener: http.RequestListener): Promise<string> {
  const server = http.createServer(listener)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  )
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

export interface ConsumerProcess {
  child: ChildProcess
  /** The URL it said it listens on. */
  url: string
  /** Its stdout and stderr so far, interleaved. */
  output(): string
  exited: Promise<unknown>
}

/**
 * Runs `file` (relative to the repository) as a consumer process of its own, through tsx (in this
 * checkout @hookq/client is TypeScript source), with a clean environment: PATH, HOME and `env`,
 * no loader of tap's. Resolves once it prints `listening on http://127.0.0.1:<port>/`; killed at
 * teardown if still running.
 */
export async function spawnConsumer(
  t: TeardownHost,
  file: string,
  env: Record<string, string>,
  timeoutMs = 30_000,
): Promise<ConsumerProcess> {
  const child = spawn(process.execPath, [...EXIT_WITH_PARENT, '--import', 'tsx', file], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
  })
  let out = ''
  child.stdout!.on('data', (d) => {
    out += d
  })
  child.stderr!.on('data', (d) => {
    out += d
  })
  const exited = new Promise((resolve) => child.on('exit', resolve))
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  const url = await waitUntil(() => /listening on (http:\/\/127\.0\.0\.1:\d+\/)/.exec(out)?.[1], timeoutMs, `${file} listening: ${out}`)
  return { child, url, output: () => out, exited }
}

/**
 * A consumer's own database: a fresh, empty one with an `effects` table of `columns` (not unique on
 * purpose: an effect that happened twice shows as two rows), and a pool on it. `newPool` makes
 * another, as a second consumer process would have.
 */
export async function consumerDatabase(t: TeardownHost, columns: string, poolSize = 4) {
  const db = await testDatabase(t, { empty: true })
  const pool = testPool(t, db.url, poolSize)
  await pool.query(`CREATE TABLE effects (${columns})`)
  const rows = async (sql: string) => (await pool.query(sql)).rows
  const newPool = (max = 3): pg.Pool => testPool(t, db.url, max)
  return { url: db.url, pool, rows, newPool }
}

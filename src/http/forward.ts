/**
 * Calls that need the pushing process's memory (acks, nacks, extend, seek, the group status) are
 * forwarded by any other broker process on the same database to the leader, and its answer is
 * relayed as it is (see src/cluster/leadership.ts). The caller was already authenticated, rate
 * limited and validated here; the leader checks the same key again (the processes share their
 * configuration). A forwarded call carries `hookq-forwarded`, so a process that stopped leading
 * meanwhile answers 503 instead of forwarding it on: no loops.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { Agent, request as undiciRequest } from 'undici'
import { HookqError } from '../errors.ts'

/** The routes the leader serves, `METHOD path` as registered. */
const LEADER_ROUTES = new Set([
  'POST /v1/groups/:group/acks',
  'POST /v1/groups/:group/nacks',
  'POST /v1/groups/:group/extend',
  'POST /v1/groups/:group/seek',
  'GET /v1/groups/:group',
])

const FORWARDED_HEADER = 'hookq-forwarded'
/** Headers passed on to the leader; everything else (hop-by-hop, host, lengths) is the client's business. */
const PASSED_HEADERS = ['authorization', 'accept', 'user-agent']
/** Headers of the leader's answer relayed to the caller. */
const RELAYED_HEADERS = ['content-type', 'retry-after', 'www-authenticate']
const FORWARD_TIMEOUT_MS = 15_000

export interface LeaderDirectory {
  /** Whether this process leads (serves these routes itself). */
  readonly isLeader: boolean
  /** The leader's base URL, or null when there is none (or it is not reachable). */
  leaderUrl(): Promise<string | null>
}

/** Installs the forwarding hook; `directory` undefined means a single process (nothing to forward). */
export function installLeaderForwarding(app: FastifyInstance, directory: LeaderDirectory | undefined): void {
  if (!directory) return
  const leaders = directory
  const agent = new Agent({ connections: 16, keepAliveTimeout: 10_000 })
  app.addHook('onClose', async () => { await agent.close() })

  // A hook on these routes only: produce and the rest never pay for it.
  app.addHook('onRoute', (route) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method]
    if (!methods.some((m) => LEADER_ROUTES.has(`${m} ${route.url}`))) return
    const existing = route.preHandler
    route.preHandler = [...(existing === undefined ? [] : Array.isArray(existing) ? existing : [existing]), forward]
  })

  async function forward(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
    if (leaders.isLeader) return undefined
    if (req.headers[FORWARDED_HEADER] !== undefined) throw notPushing('this broker process does not push for the database any more')
    const leader = await leaders.leaderUrl().catch(() => null)
    if (!leader) throw notPushing('no broker process is pushing for this database right now')
    const headers: Record<string, string> = { [FORWARDED_HEADER]: '1' }
    for (const name of PASSED_HEADERS) {
      const value = req.headers[name]
      if (typeof value === 'string') headers[name] = value
    }
    let answer: Awaited<ReturnType<typeof undiciRequest>>
    let text: string
    try {
      const body = req.body === undefined ? undefined : JSON.stringify(req.body)
      if (body !== undefined) headers['content-type'] = 'application/json'
      answer = await undiciRequest(new URL(req.url, leader), {
        method: req.method as 'GET' | 'POST', headers, body, dispatcher: agent,
        headersTimeout: FORWARD_TIMEOUT_MS, bodyTimeout: FORWARD_TIMEOUT_MS,
      })
      // Inside the try: a leader that dies after its headers is as unreachable as one that never answered.
      text = await answer.body.text()
    } catch (err) {
      throw notPushing('the broker process that pushes for this database did not answer', err)
    }
    reply.code(answer.statusCode)
    for (const name of RELAYED_HEADERS) {
      const value = answer.headers[name]
      if (typeof value === 'string') reply.header(name, value)
    }
    // Sent as it came: the leader already serialised it against the same response schema.
    return reply.serializer((payload: unknown) => payload as string).send(text)
  }
}

function notPushing(detail: string, cause?: unknown): HookqError {
  return new HookqError('unavailable', `${detail}; retry`, { retryAfterS: 1, ...(cause === undefined ? {} : { cause }) })
}

/**
 * Calls that need the memory of the process pushing a partition reach it (src/cluster/cluster.ts):
 *
 * - Acks, nacks and extend: each delivery id names its partition (src/core/delivery-id.ts), so the
 *   ids are split by owner; each other owner gets its ids in a call of the same shape, and this
 *   process answers for its own, the answers merged in request order. Acks are idempotent, so when
 *   an owner cannot be reached the whole call is 503 with Retry-After and the caller sends it again.
 * - The group status: each owner's in-flight counts for the partitions it owns.
 * - Pull: every owner of a partition of the group is asked at once for its share of maxMessages,
 *   then probed (leasing nothing) while the caller waits (src/service/acks.ts gather;
 *   docs/walkthroughs.md, "A walk through pull delivery", says why gathering beats routing to one owner).
 *   An owner's answer that leased carries a give-back token; should the caller go away before the
 *   gathered answer, the leases go back to their owner with it (a forwarded nacks call with
 *   `hookq-give-back`), leasable again at once rather than when they expire.
 *
 * Owners are as the last cluster poll saw them (src/cluster/ownership.ts). When that view is stale
 * (the owner died or gave the partition up since), the ids go to the partition's holder found afresh
 * in the database; acks, nacks and extends of a partition nobody holds are written here (a nack of
 * an attempt handed over in flight, or an extend, on its row for the next owner to read); a
 * dead-letter nack of one is 503, and the caller's retry finds its next holder.
 * The caller was already authenticated, rate limited and validated here; the owner checks the same
 * key again (the processes share their configuration and their database's stored keys). A
 * forwarded call carries `hookq-forwarded` and is never forwarded on: no loops.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { Agent, request as undiciRequest } from 'undici'
import { HookqError } from '../core/errors.ts'
import type { Leased, PullElsewhere, PullOptions, PullSource } from '../service/acks.ts'
import { parseDeliveryId } from '../core/delivery-id.ts'

/** The routes whose delivery ids are split between owners, `METHOD path` as registered. */
const ID_ROUTES = new Set(['POST /v1/groups/:group/acks', 'POST /v1/groups/:group/nacks', 'POST /v1/groups/:group/extend'])
const STATUS_ROUTE = 'GET /v1/groups/:group'
const PULL_ROUTE = 'POST /v1/groups/:group/pull'

const FORWARDED_HEADER = 'hookq-forwarded'
/** On a forwarded pull: lease nothing, answer `{"messages":[],"ready":true}` once something could be leased (src/service/acks.ts gather). */
const PROBE_HEADER = 'hookq-pull-probe'
/** On a forwarded nacks call: give these leases back (a gathering process's caller went away), with their answer's token. */
const GIVE_BACK_HEADER = 'hookq-give-back'
/** Headers passed on to an owner; everything else (hop-by-hop, host, lengths) is the client's business. */
const PASSED_HEADERS = ['authorization', 'accept', 'user-agent']
/** Headers of an owner's failed answer relayed to the caller. */
const RELAYED_HEADERS = ['content-type', 'retry-after', 'www-authenticate']
const FORWARD_TIMEOUT_MS = 15_000
/** Pulls forwarded to one owner at once at most (each a waiting caller here); more wait for a connection. */
const PULL_CONNECTIONS = 256

export interface PartitionDirectory {
  /** No other process was seen at the last poll: every call is this process's own. */
  readonly alone: boolean
  /** 'self', the owner's base URL, or null when nobody owns the partition right now. */
  ownerOf(groupName: string, partition: number): 'self' | string | null
  /** A group's partition count, if known. */
  partitionsOf(groupName: string): number | undefined
  /** Acks of a partition nobody holds, written durably: each written id's status, or null when it is held after all. */
  ackUnowned?(groupName: string, partition: number, ids: string[]): Promise<Map<string, string> | null>
  /** Nacks or extends of a partition nobody holds, written durably, like ackUnowned (null: held after all, or it needs an owner). */
  settleUnowned?(
    verb: 'nacks' | 'extend',
    groupName: string,
    partition: number,
    ids: string[],
    body: { delayMs?: number; deadLetter?: boolean; extendMs?: number },
  ): Promise<Map<string, string> | null>
  /** The URL of the process holding a partition right now (read afresh), or null. */
  holderNow?(groupName: string, partition: number): Promise<string | null>
  /** Calls `fn` whenever ownerOf may answer otherwise for some partition (a poll saw other holders, or this process took or let go of one); returns the unwatch. */
  watchOwners?(fn: () => void): () => void
}

type Result = { deliveryId: string; status: string }

declare module 'fastify' {
  interface FastifyRequest {
    /** In-flight counts of the group's partitions owned by other processes (the status route). */
    inFlightElsewhere: Map<number, number> | null
    /** The other owners of a pull group's partitions, to pull from as well (the pull route). */
    pullElsewhere: PullElsewhere | null
    /** A forwarded probe of another process's gather: wait for a leasable message, lease none (the pull route). */
    pullProbe: boolean
    /** A pull forwarded by another process's gather: its answer carries a give-back token (the pull route). */
    pullForwarded: boolean
    /** A forwarded give-back (a nacks call): the token of the answer that leased the ids (the nacks route). */
    giveBack: string | null
    /** Answers other owners gave for some of the ids, by their index in the request. */
    answeredElsewhere: { total: number; results: Map<number, Result>; local: number[] } | null
  }
}

/** An owner's answer: its status and text. */
interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  text: string
}

/** Installs the routing hooks; `directory` undefined means a single process (nothing to forward). */
export function installForwarding(app: FastifyInstance, directory: PartitionDirectory | undefined): void {
  app.decorateRequest('inFlightElsewhere', null)
  app.decorateRequest('answeredElsewhere', null)
  app.decorateRequest('pullElsewhere', null)
  app.decorateRequest('pullProbe', false)
  app.decorateRequest('pullForwarded', false)
  app.decorateRequest('giveBack', null)
  if (!directory) return
  const owners = directory
  const agent = new Agent({ connections: 16, keepAliveTimeout: 10_000 })
  // Long polls hold a connection for up to 20 s each: their own pool, so that they never queue the
  // acks (or each other, up to this many waiting per owner) behind them.
  const pullAgent = new Agent({ connections: PULL_CONNECTIONS, keepAliveTimeout: 10_000 })
  app.addHook('onClose', async () => {
    await Promise.all([agent.close(), pullAgent.close()])
  })

  // Hooks on these routes only: produce and the rest never pay for them.
  app.addHook('onRoute', (route) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method]
    const key = (m: string) => `${m} ${route.url}`
    const hooks = methods.some((m) => ID_ROUTES.has(key(m)))
      ? { pre: splitIds, ser: mergeIds }
      : methods.some((m) => key(m) === STATUS_ROUTE)
        ? { pre: countsElsewhere, ser: undefined }
        : methods.some((m) => key(m) === PULL_ROUTE)
          ? { pre: pullOwners, ser: undefined }
          : undefined
    if (!hooks) return
    route.preHandler = [...asArray(route.preHandler), hooks.pre]
    if (hooks.ser) route.preSerialization = [...asArray(route.preSerialization), hooks.ser]
  })

  async function call(base: string, req: FastifyRequest, body: unknown): Promise<Answer> {
    const headers: Record<string, string> = { [FORWARDED_HEADER]: '1' }
    for (const name of PASSED_HEADERS) {
      const value = req.headers[name]
      if (typeof value === 'string') headers[name] = value
    }
    if (body !== undefined) headers['content-type'] = 'application/json'
    try {
      // The path and query only: the owner's base URL is the one place the host comes from.
      const { pathname, search } = new URL(req.url, 'http://path.invalid')
      const answer = await undiciRequest(new URL(pathname + search, base), {
        method: req.method as 'GET' | 'POST',
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        dispatcher: agent,
        headersTimeout: FORWARD_TIMEOUT_MS,
        bodyTimeout: FORWARD_TIMEOUT_MS,
      })
      // Inside the try: an owner that dies after its headers is as unreachable as one that never answered.
      return { status: answer.statusCode, headers: answer.headers, text: await answer.body.text() }
    } catch (err) {
      throw unavailable('the broker process that pushes this partition did not answer', err)
    }
  }

  /** An owner's failure goes to the caller as the owner said it. */
  function relay(reply: FastifyReply, a: Answer): FastifyReply {
    reply.code(a.status)
    for (const name of RELAYED_HEADERS) {
      const value = a.headers[name]
      if (typeof value === 'string') reply.header(name, value)
    }
    return reply.serializer((payload: unknown) => payload as string).send(a.text)
  }

  async function splitIds(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
    if (req.headers[FORWARDED_HEADER] !== undefined) {
      const token = req.headers[GIVE_BACK_HEADER]
      if (typeof token === 'string' && req.url.endsWith('/nacks')) req.giveBack = token
      return undefined
    }
    if (owners.alone) return undefined
    const body = req.body as { deliveryIds: string[] }
    const group = (req.params as { group: string }).group
    const local: number[] = []
    const remote = new Map<string, number[]>()
    const verb = req.url.endsWith('/acks') ? 'acks' : req.url.endsWith('/nacks') ? 'nacks' : 'extend'
    const writesHere = verb === 'acks' ? owners.ackUnowned !== undefined : owners.settleUnowned !== undefined
    // Acks, nacks and extends of a partition nobody holds (moving, its owner gone) are written durably here, by partition.
    const unowned = new Map<number, number[]>()
    for (const [i, id] of body.deliveryIds.entries()) {
      const key = parseDeliveryId(id)
      // Not an id of ours: answered here (unknown), like any id of no partition.
      const owner = key ? owners.ownerOf(group, key.partition) : 'self'
      if (owner === null) {
        if (!owners.holderNow && !writesHere) throw unavailable('a partition of these deliveries is moving between broker processes')
        pushTo(unowned, key!.partition, i)
      } else if (owner === 'self') local.push(i)
      else pushTo(remote, owner, i)
    }
    if (remote.size === 0 && unowned.size === 0) return undefined
    const results = new Map<number, Result>()
    /**
     * Writes acks, nacks or extends of a partition nobody holds; false when it is held after all (or
     * a nack's or an extend's id has no attempt row). An ack whose id has no row is `unknown`, as
     * the partition's next owner answers it once loaded (it looks for the same row, and pushes the
     * message again): its owner was killed before writing the row (a row waits up to a second for
     * its outcome), or it was never issued. Left to that owner, the call was 503, and so was every
     * retry, until a survivor had taken the partition (issue 29: most ack calls answered 503 at a
     * kill were these).
     */
    const writeHere = async (partition: number, indexes: number[]): Promise<boolean> => {
      const ids = indexes.map((i) => body.deliveryIds[i]!)
      const written =
        verb === 'acks'
          ? await owners.ackUnowned?.(group, partition, ids)
          : await owners.settleUnowned?.(verb, group, partition, ids, body as { delayMs?: number; deadLetter?: boolean; extendMs?: number })
      if (!written || (verb !== 'acks' && ids.some((id) => !written.has(id)))) return false
      for (const [k, i] of indexes.entries()) results.set(i, { deliveryId: ids[k]!, status: written.get(ids[k]!) ?? 'unknown' })
      return true
    }
    /**
     * Acks, nacks or extends of a partition held after all, by a process the last poll did not see
     * holding it (it took it since): sent to that holder, found afresh; false when there is none or
     * it did not take them.
     */
    const viaHolder = async (partition: number, indexes: number[]): Promise<boolean> => {
      const url = await owners.holderNow?.(group, partition)
      if (!url) return false
      const a = await call(url, req, { ...body, deliveryIds: indexes.map((i) => body.deliveryIds[i]!) }).catch(() => undefined)
      if (a?.status !== 200) return false
      const got = (JSON.parse(a.text) as { results: Result[] }).results
      indexes.forEach((i, k) => {
        results.set(i, got[k]!)
      })
      return true
    }
    const moving = () => unavailable('a partition of these deliveries is moving between broker processes')
    const written = await Promise.all([...unowned].map(async ([p, indexes]) => (await writeHere(p, indexes)) || viaHolder(p, indexes)))
    if (written.includes(false)) throw moving()
    const answers = await Promise.all(
      [...remote].map(async ([base, indexes]) => {
        // An owner that does not answer (killed, say), or no longer holds the partition (503), may
        // have left it to nobody: its acks are written here then, if nobody holds it.
        // Those of partitions the owner still holds (its 503 was for another) go to it once more.
        const instead = async () => {
          const byPartition = new Map<number, number[]>()
          for (const i of indexes) pushTo(byPartition, parseDeliveryId(body.deliveryIds[i]!)!.partition, i)
          const held = (
            await Promise.all([...byPartition].map(async ([p, ix]) => ((await writeHere(p, ix)) || (await viaHolder(p, ix)) ? [] : ix)))
          ).flat()
          if (held.length === 0) return { a: undefined, indexes }
          const again = await call(base, req, { ...body, deliveryIds: held.map((i) => body.deliveryIds[i]!) })
          if (again.status === 503) throw moving()
          return { a: again, indexes: held }
        }
        let a: Answer
        try {
          a = await call(base, req, { ...body, deliveryIds: indexes.map((i) => body.deliveryIds[i]!) })
        } catch {
          return instead()
        }
        if (a.status === 503) return instead()
        return { a, indexes }
      }),
    )
    for (const { a, indexes } of answers) {
      if (!a) continue
      if (a.status !== 200) return relay(reply, a)
      const got = (JSON.parse(a.text) as { results: Result[] }).results
      indexes.forEach((i, k) => {
        results.set(i, got[k]!)
      })
    }
    if (local.length === 0) return reply.send({ results: body.deliveryIds.map((_, i) => results.get(i)!) })
    // This process answers for its own ids; mergeIds puts the answers back in request order.
    req.answeredElsewhere = { total: body.deliveryIds.length, results, local }
    ;(req as { body: unknown }).body = { ...body, deliveryIds: local.map((i) => body.deliveryIds[i]!) }
    return undefined
  }

  async function mergeIds(req: FastifyRequest, reply: FastifyReply, payload: unknown): Promise<unknown> {
    const elsewhere = req.answeredElsewhere
    if (!elsewhere || reply.statusCode !== 200) return payload
    const mine = (payload as { results: Result[] }).results
    const merged: Result[] = new Array<Result>(elsewhere.total)
    elsewhere.local.forEach((i, k) => {
      merged[i] = mine[k]!
    })
    for (const [i, r] of elsewhere.results) merged[i] = r
    return { results: merged }
  }

  async function countsElsewhere(req: FastifyRequest): Promise<void> {
    if (owners.alone || req.headers[FORWARDED_HEADER] !== undefined) return
    const group = (req.params as { group: string }).group
    const partitions = owners.partitionsOf(group) ?? 0
    const byOwner = new Map<string, number[]>()
    for (let p = 0; p < partitions; p++) {
      const owner = owners.ownerOf(group, p)
      if (owner !== null && owner !== 'self') pushTo(byOwner, owner, p)
    }
    if (byOwner.size === 0) return
    const counts = new Map<number, number>()
    await Promise.all(
      [...byOwner].map(async ([base, ps]) => {
        const a = await call(base, req, undefined)
        if (a.status !== 200) return // the status is read here; a group deleted meanwhile is this process's 404
        const status = JSON.parse(a.text) as { partitions: { partition: number; inFlight: number }[] }
        for (const p of status.partitions) if (ps.includes(p.partition)) counts.set(p.partition, p.inFlight)
      }),
    )
    req.inFlightElsewhere = counts
  }

  /**
   * The owners of the group's partitions, each with how many it owns and a way to pull from it:
   * read when the pull comes and again whenever its partitions move while it waits (alone now, this
   * process may not be by the end of a long poll).
   */
  async function pullOwners(req: FastifyRequest): Promise<void> {
    if (req.headers[FORWARDED_HEADER] !== undefined) {
      req.pullProbe = req.headers[PROBE_HEADER] === '1'
      req.pullForwarded = true
      return
    }
    const group = (req.params as { group: string }).group
    /** Each partition's owner as seen now ('self', a URL, or none), one text to compare. */
    const seen = () => {
      const out: (string | null)[] = []
      for (let p = 0; p < (owners.partitionsOf(group) ?? 0); p++) out.push(owners.ownerOf(group, p))
      return out
    }
    req.pullElsewhere = {
      owners: () => {
        const byOwner = new Map<string, number>()
        let selfParts = 0
        if (!owners.alone) {
          for (const owner of seen()) {
            if (owner === 'self') selfParts++
            else if (owner !== null) byOwner.set(owner, (byOwner.get(owner) ?? 0) + 1)
          }
        }
        return { selfParts, others: [...byOwner].map(([base, parts]) => pullSource(req, group, base, parts)) }
      },
      watch: (moved) => {
        if (!owners.watchOwners) return () => {}
        // Told of every change to any group's owners: this group's only are a move for this pull.
        let last = seen().join('\n')
        return owners.watchOwners(() => {
          const now = seen().join('\n')
          if (now === last) return
          last = now
          moved()
        })
      },
    }
  }

  /** An owner of `parts` of the group's partitions, at `base`, as a source of a gather. */
  function pullSource(req: FastifyRequest, group: string, base: string, parts: number): PullSource {
    return {
      parts,
      pull: async (opts, signal): Promise<Leased> => {
        const a = await pullFrom(base, req, opts, signal, false)
        if (!a) return { envelopes: [], giveBack: () => {} }
        const answer = JSON.parse(a) as { messages: unknown[]; giveBack?: string }
        return {
          envelopes: answer.messages.map((m) => JSON.stringify(m)),
          giveBack: (deliveryIds) => {
            if (answer.giveBack !== undefined) giveBackTo(base, req, group, deliveryIds, answer.giveBack)
          },
        }
      },
      probe: async (waitMs, signal) => {
        const a = await pullFrom(base, req, { maxMessages: 1, waitMs, leaseMs: undefined }, signal, true)
        return a ? (JSON.parse(a) as { ready?: boolean }).ready === true : false
      },
    }
  }

  /**
   * Leases an owner made for a caller that went away, back to it (best effort: if it fails, they
   * expire at their deadline and are retried, as before). Not the caller's call: nothing waits for it.
   */
  function giveBackTo(base: string, req: FastifyRequest, group: string, deliveryIds: string[], token: string): void {
    const headers: Record<string, string> = { [FORWARDED_HEADER]: '1', [GIVE_BACK_HEADER]: token, 'content-type': 'application/json' }
    for (const name of PASSED_HEADERS) {
      const value = req.headers[name]
      if (typeof value === 'string') headers[name] = value
    }
    undiciRequest(new URL(`/v1/groups/${encodeURIComponent(group)}/nacks`, base), {
      method: 'POST',
      headers,
      body: JSON.stringify({ deliveryIds }),
      dispatcher: agent,
      headersTimeout: FORWARD_TIMEOUT_MS,
      bodyTimeout: FORWARD_TIMEOUT_MS,
    })
      .then((a) => a.body.dump())
      .catch(() => {})
  }

  /**
   * One owner's answer text (null: it failed or could not be reached; the others' answers stand).
   * `opts.waitMs` is what is left of the caller's wait when this is sent: the owner's own timer
   * runs from there, so every hop ends within the caller's one deadline.
   */
  async function pullFrom(
    base: string,
    req: FastifyRequest,
    opts: PullOptions,
    signal: AbortSignal | undefined,
    probe: boolean,
  ): Promise<string | null> {
    const headers: Record<string, string> = { [FORWARDED_HEADER]: '1', 'content-type': 'application/json' }
    if (probe) headers[PROBE_HEADER] = '1'
    for (const name of PASSED_HEADERS) {
      const value = req.headers[name]
      if (typeof value === 'string') headers[name] = value
    }
    const { pathname } = new URL(req.url, 'http://path.invalid')
    const timeoutMs = FORWARD_TIMEOUT_MS + opts.waitMs
    const answer = await undiciRequest(new URL(pathname, base), {
      method: 'POST',
      headers,
      body: JSON.stringify({
        maxMessages: opts.maxMessages,
        waitMs: opts.waitMs,
        ...(opts.leaseMs === undefined ? {} : { leaseMs: opts.leaseMs }),
      }),
      dispatcher: pullAgent,
      ...(signal ? { signal } : {}),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    })
    const text = await answer.body.text()
    // The owner refused the caller's key (deleted or expired there first: each process learns of
    // a key's deletion within its refresh): so does this answer, not an empty 200 a moment before
    // this process would refuse it too.
    if (answer.statusCode === 401 || answer.statusCode === 403) {
      throw new HookqError(answer.statusCode === 401 ? 'unauthorized' : 'forbidden', refusal(text))
    }
    return answer.statusCode === 200 ? text : null
  }
}

/** The detail of an owner's refusal (its problem document's, which never quotes the key). */
function refusal(text: string): string {
  try {
    const detail = (JSON.parse(text) as { detail?: unknown }).detail
    if (typeof detail === 'string') return detail
  } catch {}
  return 'the API key was refused by the broker process that owns the partition'
}

function pushTo<K, V>(m: Map<K, V[]>, k: K, v: V): void {
  const list = m.get(k)
  if (list) list.push(v)
  else m.set(k, [v])
}

function asArray<T>(v: T | T[] | undefined): T[] {
  return v === undefined ? [] : Array.isArray(v) ? v : [v]
}

function unavailable(detail: string, cause?: unknown): HookqError {
  return new HookqError('unavailable', `${detail}; retry`, { retryAfterS: 1, ...(cause === undefined ? {} : { cause }) })
}

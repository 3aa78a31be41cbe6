/**
 * The rules for consumer groups and their consumers: creation with defaults, immutable topic,
 * where a new group starts (startAt), partition assignment, and the status view.
 *
 * Assignment: a group's enabled consumers, ordered by registration, take the topic's partitions
 * round robin (partition p → consumer p mod n). It is a pure function of the consumer list, so
 * every reader computes the same owner, and a consumer that joins or leaves moves only the
 * partitions the formula moves.
 */
import { randomUUID } from 'node:crypto'
import { HookqError } from '../core/errors.ts'
import { checkUrl, type UrlPolicy } from '../security/url-policy.ts'
import type { Database } from '../store/db.ts'
import {
  createGroup,
  deleteConsumer,
  deleteGroup,
  disableConsumer,
  findConsumer,
  findGroupByName,
  insertConsumer,
  insertMissingOffsets,
  listAllConsumers,
  listConsumers,
  listGroupNamesOfTopic,
  listGroups,
  readCommittedOffsets,
  readFilteredCounts,
  rotateConsumerSecret,
  updateConsumer,
  updateGroup,
  type ConsumerChanges,
  type ConsumerRow,
  type GroupRow,
  type GroupSettings,
} from '../store/groups.ts'
import { firstOffsets, offsetsAtTime } from '../store/messages.ts'
import { readHealth, type ConsumerHealthView } from '../store/consumer-health.ts'
import { parseInstant } from './instants.ts'
import { findTopicByName, readEndOffsets } from '../store/topics.ts'
import { decodeSecret, generateSecret } from '../core/signature.ts'
import { compileFilter, FilterError } from '../core/filter.ts'
import { assignPartitions } from '../core/consumer-assignment.ts'
import { SecretBox, SecretsKeyError } from '../security/secrets.ts'
import {
  authColumns,
  authView,
  checkAuth,
  openConsumer,
  openSigningSecret,
  resealAuthForUrl,
  sealSigningSecret,
  type OpenedConsumer,
  type PushAuthInput,
} from './consumer-auth.ts'
import {
  flatName,
  GROUP_SETTINGS,
  type GroupInput,
  type GroupView,
  type ObjectSetting,
  type Setting,
  type ValueSetting,
} from '../core/group-settings.ts'

/** A PUT body: every setting optional but the topic (Static<> of GroupConfig, built from the settings table). */
export type { GroupInput }

/** How long a rotated-out secret keeps signing pushes when the caller does not say: 24 h. */
export const DEFAULT_SECRET_OVERLAP_MS = 86_400_000
/** The longest overlap a rotation may ask for: 7 days. */
export const MAX_SECRET_OVERLAP_MS = 7 * 86_400_000

const NO_HEALTH: ConsumerHealthView = { lastSuccessAt: null, lastFailureAt: null, lastError: null, recentFailureRate: null }

/** A consumer's registration (POST body). */
export interface ConsumerInput {
  url: string
  secret?: string
  auth?: PushAuthInput
  rateLimitPerSecond?: number
  maxConcurrency?: number
}

/** A consumer's change (PATCH body): what is named changes, null removes a limit. */
export interface ConsumerPatch {
  url?: string
  /** null removes it */
  auth?: PushAuthInput | null
  rateLimitPerSecond?: number | null
  maxConcurrency?: number | null
}

/** The push timeout of a group that sets none, unless its ackTimeoutMs is shorter. */
export const DEFAULT_PUSH_TIMEOUT_MS: number = GROUP_SETTINGS.pushTimeoutMs.default

/**
 * A consumer_groups row, or the part of one that holds settings, by column name: a setting's column
 * is its flat name (flatName: ackMode → ackMode, retry.jitter → retryJitter).
 */
type Columns = Record<string, unknown>

/** The settings of the table that have columns; `ordered` has none (it is a spelling of ordering). */
const STORED = (Object.entries(GROUP_SETTINGS) as [string, Setting][]).filter(
  (entry): entry is [string, ValueSetting | ObjectSetting] => entry[1].kind !== 'alias',
)

/** A value as its column holds it: the filter as its JSON text, anything else as it is. */
function stored(s: ValueSetting, value: unknown): unknown {
  return s.json && value !== null && value !== undefined ? JSON.stringify(value) : value
}

/** The columns of a group that sets nothing: the defaults of src/core/group-settings.ts. */
function defaultColumns(): Columns {
  const columns: Columns = {}
  for (const [name, s] of STORED) {
    if (s.kind === 'value') columns[name] = stored(s, s.default)
    else for (const [member, m] of Object.entries(s.members)) columns[flatName(name, member)] = m.default ?? null
  }
  return columns
}

/**
 * The columns a PUT body sets, over `base` (the defaults, or the group's current columns): a setting
 * left out keeps its column, null (where the schema allows it) clears it. An object given by member
 * (retry) keeps the members left out; one given whole (batch) gives the members it leaves out their
 * defaults, not their previous values.
 */
function columnsFrom(input: Columns, base: Columns): Columns {
  const columns: Columns = {}
  for (const [name, s] of STORED) {
    const given = input[name]
    if (s.kind === 'value') {
      columns[name] = given === undefined ? base[name] : stored(s, given)
      continue
    }
    for (const [member, m] of Object.entries(s.members)) {
      const column = flatName(name, member)
      const value = (given as Columns | null | undefined)?.[member]
      if (given === undefined) columns[column] = base[column]
      else if (s.given === 'whole') columns[column] = value ?? m.default ?? null
      else columns[column] = value === undefined ? base[column] : value
    }
  }
  return columns
}

/** The settings of a row as the API shows them: a nullable object (batch) is null when its required member's column is. */
function settingsView(row: Columns): Columns {
  const view: Columns = {}
  for (const [name, s] of STORED) {
    if (s.kind === 'value') {
      const value = row[name]
      view[name] = s.json && value !== null ? JSON.parse(value as string) : value
    } else if (s.key !== undefined && row[flatName(name, s.key)] === null) {
      view[name] = null
    } else {
      view[name] = Object.fromEntries(Object.keys(s.members).map((member) => [member, row[flatName(name, member)]]))
    }
  }
  return view
}

/** The columns of a new group that sets nothing; pushTimeoutSet false: its push timeout follows ackTimeoutMs. */
export const GROUP_DEFAULTS = { ...defaultColumns(), pushTimeoutSet: false } as Omit<GroupSettings, 'topic'>

export function groupView(g: GroupRow): GroupView {
  return {
    name: g.name,
    topic: g.topic,
    ...settingsView(g),
    // Not a column: the v1 spelling of ordering (see orderingOf).
    ordered: g.ordering === 'partition',
    createdAt: g.createdAt.toISOString(),
    updatedAt: g.updatedAt.toISOString(),
  } as GroupView
}

export function consumerView(c: ConsumerRow) {
  return {
    id: c.id,
    url: c.url,
    createdAt: c.createdAt.toISOString(),
    disabled: c.disabledAt !== null,
    disabledReason: c.disabledReason,
    hasSecret: c.secret !== null,
    // Type, header names, clientId: never a value (contract v1.2 "Push authentication").
    auth: authView(c),
    rateLimitPerSecond: c.rateLimitPerSecond,
    maxConcurrency: c.maxConcurrency,
  }
}

/**
 * The answer to a secret rotation. The secret itself only when the broker generated it: that
 * answer is the one chance to learn it.
 */
export function rotationView(c: ConsumerRow, generatedSecret?: string) {
  return {
    id: c.id,
    url: c.url,
    createdAt: c.createdAt.toISOString(),
    hasSecret: c.secret !== null,
    secretRotatedAt: (c.secretRotatedAt ?? new Date()).toISOString(),
    previousSecretExpiresAt: c.previousSecret && c.previousSecretExpiresAt ? c.previousSecretExpiresAt.toISOString() : null,
    ...(generatedSecret === undefined ? {} : { secret: generatedSecret }),
  }
}

/** A stored signing secret in the clear, or null when it cannot be opened (then it is not the same as any). */
function openedOrNull(stored: string, id: string, box: SecretBox): string | null {
  try {
    return openSigningSecret(stored, id, box)
  } catch {
    return null
  }
}

/** Refuses a secret Standard Webhooks libraries would read differently (not base64, or outside 24–64 bytes). */
function checkSecret(secret: string): void {
  try {
    decodeSecret(secret)
  } catch (err) {
    throw new HookqError('invalid_request', (err as Error).message)
  }
}

/**
 * Settings from a PUT body, over `base` (the defaults, or the group's current settings): the
 * table's columns (columnsFrom), then the two rules the table leaves to code.
 *
 * `ordered` and `ordering` are two spellings of one setting (orderingOf reconciles them).
 *
 * pushTimeoutMs is the one default that depends on another setting: a group that never set it
 * (or set it to null) has min(10000, ackTimeoutMs), recomputed whenever ackTimeoutMs changes. Once
 * the caller gives a value it stays theirs: an update that lowers ackTimeoutMs below it is refused
 * (validated), not silently changed, since the caller chose it.
 */
function settingsFrom(input: GroupInput, base: Omit<GroupSettings, 'topic'>): GroupSettings {
  const columns = columnsFrom(input, base) as Omit<GroupSettings, 'topic' | 'pushTimeoutSet'>
  const pushTimeoutSet = input.pushTimeoutMs === undefined ? base.pushTimeoutSet : input.pushTimeoutMs !== null
  return {
    ...columns,
    topic: input.topic,
    ordering: orderingOf(input) ?? base.ordering,
    pushTimeoutMs: pushTimeoutSet ? (input.pushTimeoutMs ?? base.pushTimeoutMs) : Math.min(DEFAULT_PUSH_TIMEOUT_MS, columns.ackTimeoutMs),
    pushTimeoutSet,
  }
}

export class GroupService {
  private readonly listeners = new Set<(group: string) => Promise<void>>()

  constructor(
    private readonly db: Database,
    /** Consumer URLs the policy denies are refused with url_not_allowed; none: no policy checks. */
    private readonly pushPolicy?: UrlPolicy,
    /** Seals secret values before they are stored, opens them for the dispatcher (HOOKQ_SECRETS_KEY). */
    private readonly secrets: SecretBox = new SecretBox(),
  ) {}

  /** Registers a listener told (and awaited) after a group or its consumers change. */
  onChange(listener: (group: string) => Promise<void>): void {
    this.listeners.add(listener)
  }

  private async changed(name: string): Promise<void> {
    for (const listener of this.listeners) await listener(name)
  }

  /** Creates the group (201) or updates its settings (200). The topic of a group cannot change. */
  async put(name: string, input: GroupInput): Promise<{ group: GroupRow; created: boolean }> {
    const result = await this.upsert(name, input)
    await this.changed(name)
    return result
  }

  private async upsert(name: string, input: GroupInput): Promise<{ group: GroupRow; created: boolean }> {
    validateStartAt(input.startAt)
    if (input.deadLetterTopic) {
      if (input.deadLetterTopic === input.topic) {
        throw new HookqError('invalid_request', 'deadLetterTopic must differ from the topic the group consumes')
      }
      await this.requireTopic(input.deadLetterTopic, 'dead-letter topic')
    }
    for (;;) {
      const existing = await findGroupByName(this.db.prisma, name)
      if (existing) {
        if (existing.topic !== input.topic) {
          throw new HookqError(
            'group_conflict',
            `group ${name} consumes topic ${existing.topic}; a group's topic cannot change (create another group)`,
          )
        }
        const { topic: _topic, ...current } = existing
        const settings = validated(settingsFrom(input, current))
        // A pull group has no consumers (contract "Pull delivery"): they are removed first, by the
        // caller, rather than dropped here unasked. (One registered in a race with this switch is
        // kept but unused: a pull group's dispatcher never pushes.)
        if (existing.delivery === 'push' && settings.delivery === 'pull') {
          const consumers = await listConsumers(this.db.prisma, existing.id)
          if (consumers.length > 0)
            throw new HookqError(
              'group_has_consumers',
              `group ${name} has ${consumers.length} consumer(s); remove them (DELETE /v1/groups/${name}/consumers/{id}) before switching it to delivery "pull"`,
            )
        }
        return { group: await updateGroup(this.db.prisma, existing.id, settings), created: false }
      }
      const topic = await this.requireTopic(input.topic, 'topic')
      const settings = validated(settingsFrom(input, GROUP_DEFAULTS))
      const starts = await this.startOffsets(topic.id, topic.partitions, settings.startAt)
      const offsets = starts.map((committedOffset, partition) => ({ topicId: topic.id, partition, committedOffset }))
      const group = await createGroup(this.db.prisma, name, settings, offsets)
      if (group) return { group, created: true }
      // A concurrent creator won: read theirs and update it like any existing group.
    }
  }

  /** The topic a group consumes, as a list for the access checks; null when there is no such group. */
  async topicsOf(name: string): Promise<string[] | null> {
    const group = await findGroupByName(this.db.prisma, name)
    return group ? [group.topic] : null
  }

  /** The topics a group names: its topic and dead-letter topic (a write naming others points the group elsewhere); null for no such group. */
  async namedTopicsOf(name: string): Promise<string[] | null> {
    const group = await findGroupByName(this.db.prisma, name)
    return group ? [group.topic, ...(group.deadLetterTopic ? [group.deadLetterTopic] : [])] : null
  }

  async get(name: string): Promise<GroupRow> {
    const group = await findGroupByName(this.db.prisma, name)
    if (!group) throw new HookqError('group_not_found', `group ${name} does not exist`)
    return group
  }

  async list(): Promise<GroupRow[]> {
    return listGroups(this.db.prisma)
  }

  async delete(name: string): Promise<void> {
    const group = await this.get(name)
    if (!(await deleteGroup(this.db.prisma, group.id))) throw new HookqError('group_not_found', `group ${name} does not exist`)
    await this.changed(name)
  }

  /** The group's row and consumers, or null (for the dispatcher). */
  async load(name: string): Promise<{ row: GroupRow; consumers: OpenedConsumer[] } | null> {
    const row = await findGroupByName(this.db.prisma, name)
    return row ? { row, consumers: (await listConsumers(this.db.prisma, row.id)).map((c) => openConsumer(c, this.secrets)) } : null
  }

  /** Every group's row and consumers, in two statements whatever the number of groups (for the dispatcher). */
  async loadAll(): Promise<{ row: GroupRow; consumers: OpenedConsumer[] }[]> {
    const [rows, consumers] = await Promise.all([listGroups(this.db.prisma), listAllConsumers(this.db.prisma)])
    const byGroup = new Map<number, OpenedConsumer[]>()
    for (const row of consumers) {
      const c = openConsumer(row, this.secrets)
      const list = byGroup.get(c.groupId)
      if (list) list.push(c)
      else byGroup.set(c.groupId, [c])
    }
    return rows.map((row) => ({ row, consumers: byGroup.get(row.id) ?? [] }))
  }

  /** Names of the groups consuming a topic. */
  async namesForTopic(topic: string): Promise<string[]> {
    return listGroupNamesOfTopic(this.db.prisma, topic)
  }

  /** The group with per-partition committed offset, end offset, lag, in-flight count and owner. */
  async status(name: string, inFlight: (groupId: number, partition: number) => number = () => 0) {
    const group = await this.get(name)
    const consumers = await listConsumers(this.db.prisma, group.id)
    const topic = await findTopicByName(this.db.prisma, group.topic)
    const partitions: {
      partition: number
      committedOffset: number
      endOffset: number
      lag: number
      inFlight: number
      consumerId: string | null
      filtered: number
    }[] = []
    if (topic) {
      const ends = await readEndOffsets(this.db.prisma, topic.id)
      const committed = await this.ensureOffsets(group, topic.id, topic.partitions)
      const owners = assignPartitions(topic.partitions, consumers)
      const filtered = await readFilteredCounts(this.db.prisma, group.id, topic.id)
      for (const { partition, endOffset } of ends) {
        const committedOffset = committed.get(partition) ?? 0
        partitions.push({
          partition,
          committedOffset,
          endOffset,
          lag: Math.max(0, endOffset - committedOffset),
          inFlight: inFlight(group.id, partition),
          consumerId: owners[partition] ?? null,
          filtered: filtered.get(partition) ?? 0,
        })
      }
    }
    const health = await readHealth(
      this.db.pool,
      consumers.map((c) => c.id),
      Date.now(),
    )
    return {
      ...groupView(group),
      partitions,
      consumers: consumers.map((c) => ({ ...consumerView(c), health: health.get(c.id) ?? NO_HEALTH })),
    }
  }

  async addConsumer(groupName: string, input: ConsumerInput): Promise<ConsumerRow> {
    const group = await this.get(groupName)
    if (group.delivery === 'pull') {
      throw new HookqError(
        'pull_group',
        `group ${groupName} is a pull group (delivery "pull"): callers take its messages with POST /v1/groups/${groupName}/pull`,
      )
    }
    const url = this.consumerUrl(input.url)
    if (input.secret !== undefined) checkSecret(input.secret)
    const auth = input.auth === undefined ? null : checkAuth(input.auth, (u) => this.consumerUrl(u, 'auth.tokenUrl'))
    const id = randomUUID()
    const consumer = await insertConsumer(
      this.db.prisma,
      group.id,
      id,
      url,
      input.secret === undefined ? null : sealSigningSecret(input.secret, id, this.secrets),
      { rateLimitPerSecond: input.rateLimitPerSecond ?? null, maxConcurrency: input.maxConcurrency ?? null },
      authColumns(auth, id, url, this.secrets),
    )
    await this.changed(groupName)
    return consumer
  }

  /**
   * Changes a consumer in place (its url, its limits; null removes a limit). It keeps its id, its
   * place in the group's consumer order and so its partitions; the dispatcher reloads the group
   * before this returns, so the next push goes to the new url with the new limits.
   */
  async updateConsumer(groupName: string, id: string, patch: ConsumerPatch): Promise<ConsumerRow> {
    const group = await this.get(groupName)
    // Checked before the transaction (a 400 changes nothing and holds no lock).
    const url = patch.url === undefined ? undefined : this.consumerUrl(patch.url)
    const auth = patch.auth == null ? patch.auth : checkAuth(patch.auth, (u) => this.consumerUrl(u, 'auth.tokenUrl'))
    // Computed from the row under its lock (store updateConsumer): auth values are sealed for the
    // URL they go to (consumer-auth.ts authPlace), the one this update leaves, read in the same transaction.
    const consumer = await updateConsumer(this.db.prisma, group.id, id, (current) => {
      const changes: ConsumerChanges = {}
      if (url !== undefined) changes.url = url
      if (auth !== undefined) {
        Object.assign(changes, authColumns(auth, id, url ?? current.url, this.secrets))
      } else if (url !== undefined) {
        try {
          changes.authSecret = resealAuthForUrl(current, url, this.secrets)
        } catch (err) {
          if (!(err instanceof SecretsKeyError)) throw err
          // A value this process cannot open stays as it is: its pushes already fail with the reason.
        }
      }
      if (patch.rateLimitPerSecond !== undefined) changes.rateLimitPerSecond = patch.rateLimitPerSecond
      if (patch.maxConcurrency !== undefined) changes.maxConcurrency = patch.maxConcurrency
      return changes
    })
    if (!consumer) throw new HookqError('consumer_not_found', `group ${groupName} has no consumer ${id}`)
    await this.changed(groupName)
    return consumer
  }

  /** A consumer url as it is stored, after the checks every url passes (scheme, no credentials, the push policy). */
  private consumerUrl(url: string, what = 'consumer url'): string {
    const parsed = parseUrl(url, what)
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new HookqError('invalid_request', `${what} must be http:// or https://, got ${parsed.protocol}`)
    }
    if (parsed.username || parsed.password) {
      throw new HookqError('invalid_request', `${what} must not carry credentials; use auth (or sign pushes with a secret) instead`)
    }
    const verdict = this.pushPolicy ? checkUrl(parsed, this.pushPolicy) : undefined
    if (verdict && !verdict.allowed) {
      throw new HookqError('url_not_allowed', `${what} ${parsed.href} is not allowed: ${verdict.reason}`)
    }
    return parsed.href
  }

  /**
   * Gives a consumer a new secret (`secret`, or a generated one). Its current secret keeps signing
   * pushes, after the new one, for `overlapMs`; a consumer without a secret just gets one. The
   * dispatcher reloads the group's consumers before this returns, so the next push is signed anew.
   */
  async rotateSecret(
    groupName: string,
    id: string,
    opts: { secret?: string; overlapMs?: number } = {},
  ): Promise<{ consumer: ConsumerRow; generated?: string }> {
    const overlapMs = opts.overlapMs ?? DEFAULT_SECRET_OVERLAP_MS
    if (!Number.isInteger(overlapMs) || overlapMs < 0 || overlapMs > MAX_SECRET_OVERLAP_MS) {
      throw new HookqError('invalid_request', `overlapMs must be an integer from 0 to ${MAX_SECRET_OVERLAP_MS}, got ${overlapMs}`)
    }
    if (opts.secret !== undefined) checkSecret(opts.secret)
    const group = await this.get(groupName)
    const generated = opts.secret === undefined ? generateSecret() : undefined
    const secret = opts.secret ?? generated!
    // Sealed values differ on every write: the store's "already current" check needs the stored one.
    const current = await findConsumer(this.db.prisma, group.id, id)
    const same = current?.secret != null && openedOrNull(current.secret, id, this.secrets) === secret
    const now = new Date()
    const consumer = await rotateConsumerSecret(
      this.db.prisma,
      group.id,
      id,
      same ? current.secret! : sealSigningSecret(secret, id, this.secrets),
      new Date(now.getTime() + overlapMs),
      now,
    )
    if (!consumer) throw new HookqError('consumer_not_found', `group ${groupName} has no consumer ${id}`)
    await this.changed(groupName)
    return generated === undefined ? { consumer } : { consumer, generated }
  }

  async consumers(groupName: string): Promise<ConsumerRow[]> {
    return listConsumers(this.db.prisma, (await this.get(groupName)).id)
  }

  async removeConsumer(groupName: string, id: string): Promise<void> {
    const group = await this.get(groupName)
    if (!(await deleteConsumer(this.db.prisma, group.id, id))) {
      throw new HookqError('consumer_not_found', `group ${groupName} has no consumer ${id}`)
    }
    await this.changed(groupName)
  }

  /** Marks a consumer disabled (it answered 410 Gone). */
  async disableConsumer(id: string, reason: string): Promise<void> {
    await disableConsumer(this.db.prisma, id, reason)
  }

  private async requireTopic(name: string, what: string) {
    const topic = await findTopicByName(this.db.prisma, name)
    if (!topic) throw new HookqError('topic_not_found', `${what} ${name} does not exist; create it first`)
    return topic
  }

  /** Committed offsets of every partition, initialising (from startAt) those the group has none for. */
  async ensureOffsets(group: GroupRow, topicId: number, partitionCount: number): Promise<Map<number, number>> {
    const committed = await readCommittedOffsets(this.db.prisma, group.id, topicId)
    if (committed.size < partitionCount) {
      const starts = await this.startOffsets(topicId, partitionCount, group.startAt)
      const missing = starts.flatMap((committedOffset, partition) =>
        committed.has(partition) ? [] : [{ topicId, partition, committedOffset }],
      )
      await insertMissingOffsets(this.db.prisma, group.id, missing)
      return readCommittedOffsets(this.db.prisma, group.id, topicId)
    }
    return committed
  }

  /** Where a group starting now begins on each partition. */
  private async startOffsets(topicId: number, partitions: number, startAt: string): Promise<number[]> {
    const ends = await readEndOffsets(this.db.prisma, topicId)
    const end = (p: number) => ends.find((e) => e.partition === p)?.endOffset ?? 0
    if (startAt === 'latest') return Array.from({ length: partitions }, (_, p) => end(p))
    const firsts =
      startAt === 'earliest' ? await firstOffsets(this.db.pool, topicId) : await offsetsAtTime(this.db.pool, topicId, new Date(startAt))
    return Array.from({ length: partitions }, (_, p) => firsts.get(p) ?? end(p))
  }
}

/**
 * The consumer URL as the WHATWG parser reads it (the pusher's reading too). The schema's
 * `format: "uri"` is RFC 3986 syntax, which also passes ports past 65535, `:80:80`, percent-encoded
 * or punycode host names the parser refuses: those are the caller's mistake, a 400.
 */
function parseUrl(url: string, what: string): URL {
  try {
    return new URL(url)
  } catch {
    throw new HookqError(
      'invalid_request',
      `${what} ${JSON.stringify(url)} is not a valid URL (check the port, 0 to 65535, and the host name)`,
    )
  }
}

/**
 * The ordering a PUT asks for, from either spelling (`ordered: true` is `ordering: "partition"`,
 * `ordered: false` is "none"); both given must agree. Undefined: neither given, it stays.
 */
function orderingOf(input: GroupInput): GroupSettings['ordering'] | undefined {
  if (input.ordering === undefined) return input.ordered === undefined ? undefined : input.ordered ? 'partition' : 'none'
  if (input.ordered !== undefined && input.ordered !== (input.ordering === 'partition')) {
    throw new HookqError(
      'invalid_request',
      `ordered: ${input.ordered} contradicts ordering: "${input.ordering}" (ordered: true is ordering: "partition"; send one of them)`,
    )
  }
  return input.ordering
}

function validateStartAt(startAt: string | undefined): void {
  if (startAt !== undefined && startAt !== 'earliest' && startAt !== 'latest' && parseInstant(startAt) === undefined) {
    throw new HookqError(
      'invalid_request',
      `startAt must be "earliest", "latest" or an RFC 3339 date-time such as 2026-01-01T00:00:00Z, got ${JSON.stringify(startAt)}`,
    )
  }
}

/** Checks the settings as a whole (after defaults), where one value bounds another. */
function validated(s: GroupSettings): GroupSettings {
  // Only a pushTimeoutMs the caller set can exceed ackTimeoutMs (the default follows it).
  if (s.pushTimeoutMs > s.ackTimeoutMs) {
    throw new HookqError(
      'invalid_request',
      `pushTimeoutMs (${s.pushTimeoutMs}) must not exceed ackTimeoutMs (${s.ackTimeoutMs}); pushTimeoutMs was set ` +
        'explicitly (in this call or before): send a lower one, or pushTimeoutMs: null for the default min(10000, ackTimeoutMs)',
    )
  }
  if (s.retryInitialDelayMs > s.retryMaxDelayMs) {
    throw new HookqError(
      'invalid_request',
      `retry.initialDelayMs (${s.retryInitialDelayMs}) must not exceed retry.maxDelayMs (${s.retryMaxDelayMs})`,
    )
  }
  if (s.batchMaxMessages !== null && s.pushFormat !== 'envelope') {
    throw new HookqError(
      'invalid_request',
      `batch needs pushFormat "envelope" (a batch is {"deliveries": [<envelope>, ...]}); the group's pushFormat is "${s.pushFormat}"`,
    )
  }
  if (s.filter !== null) {
    try {
      compileFilter(JSON.parse(s.filter))
    } catch (err) {
      if (err instanceof FilterError) throw new HookqError('invalid_request', err.message)
      throw err
    }
  }
  return s
}

// @ts-check
/**
 * Replaying dead letters: a message of a dead-letter topic goes back to the topic it came from,
 * with its key, value and headers but without the hookq-dlq-* headers the broker added, into its
 * original partition (when the topic still has it). Each replay carries the idempotency key
 * `hookq-replay:<dlqTopic>@<DLQ creation time, ms>:<partition>:<offset>` (the SDK's and the CLI's
 * too), so a double click, a second tab, a "replay all" after single replays or a `hookq dlq
 * replay` stores it once (within the original topic's retention).
 */
import { api } from './api.js'

export const DLQ_HEADER_PREFIX = 'hookq-dlq-'
// Produce takes at most 1000 messages a call; 100 keeps a call well under the 10 MiB body limit
// for typical messages.
const BATCH = 100

/**
 * What the broker recorded about a dead letter, from its hookq-dlq-* headers.
 * @param {Record<string, string>} headers
 */
export function deadLetterInfo(headers) {
  // The same reading as the SDK's deadLetterOrigin (clients/typescript/src/dlq.ts): an empty topic
  // is no topic, and a position is digits only ('' or '1e2' are not 0 or 100).
  return {
    topic: headers['hookq-dlq-topic'] || null,
    partition: wholeNumber(headers['hookq-dlq-partition']),
    offset: wholeNumber(headers['hookq-dlq-offset']),
    group: headers['hookq-dlq-group'] ?? null,
    attempts: headers['hookq-dlq-attempts'] ?? null,
    error: headers['hookq-dlq-error'] ?? null,
  }
}

/** @param {string | undefined} text @returns {number | null} */
function wholeNumber(text) {
  return text !== undefined && /^\d{1,15}$/.test(text) ? Number(text) : null
}

/** The headers of the original message. @param {Record<string, string>} headers */
export function originalHeaders(headers) {
  return Object.fromEntries(Object.entries(headers).filter(([k]) => !k.startsWith(DLQ_HEADER_PREFIX)))
}

/**
 * The idempotency key of a replay: the same as the SDK's `replayIdempotencyKey` (and so the CLI's),
 * so a dead letter replayed from here and from `hookq dlq replay` is stored once. The DLQ topic's
 * creation time keeps a deleted and recreated DLQ (whose offsets start again) from colliding.
 * @param {string} dlqTopic @param {string} dlqCreatedAt @param {number} partition @param {number} offset
 */
export function replayKey(dlqTopic, dlqCreatedAt, partition, offset) {
  return `hookq-replay:${dlqTopic}@${Date.parse(dlqCreatedAt)}:${partition}:${offset}`
}

/**
 * The produce call that replays one dead letter, or why it cannot be replayed. The original
 * partition is named when the topic still has it (`targetPartitions` unknown counts as yes);
 * otherwise the key, or the broker's spreading, places it.
 * @param {string} dlqTopic
 * @param {string} dlqCreatedAt
 * @param {import('./api.js').Message} m
 * @param {number} [targetPartitions] how many partitions the original topic has now
 * @returns {{ topic: string, message: import('./api.js').ProduceMessage } | { error: string }}
 */
export function replayOf(dlqTopic, dlqCreatedAt, m, targetPartitions) {
  const info = deadLetterInfo(m.headers)
  if (info.topic === null) return { error: 'no hookq-dlq-topic header: not a dead letter hookq wrote' }
  /** @type {import('./api.js').ProduceMessage} */
  const message = {
    value: m.value,
    headers: originalHeaders(m.headers),
    idempotencyKey: replayKey(dlqTopic, dlqCreatedAt, m.partition, m.offset),
  }
  if (m.key !== null) message.key = m.key
  if (info.partition !== null && (targetPartitions === undefined || info.partition < targetPartitions)) message.partition = info.partition
  return { topic: info.topic, message }
}

/**
 * How many partitions each topic has now; undefined where that cannot be read (a key without
 * the produce scope, or a topic gone), so the replay still goes ahead with the original partitions.
 * @param {string[]} topics
 * @returns {Promise<Map<string, number | undefined>>}
 */
async function partitionCounts(topics) {
  /** @type {Map<string, number | undefined>} */
  const counts = new Map()
  for (const topic of topics) {
    counts.set(
      topic,
      await api.topic(topic).then(
        (t) => t.partitions,
        () => undefined,
      ),
    )
  }
  return counts
}

/**
 * @typedef {{ ok: true, topic: string, partition: number, offset: number, duplicate: boolean } | { ok: false, error: unknown }} ReplayOutcome
 */

/**
 * Replays dead letters of `dlqTopic`, one produce call per original topic and batch; outcomes in
 * the order of `messages`.
 * @param {string} dlqTopic
 * @param {import('./api.js').Message[]} messages
 * @returns {Promise<ReplayOutcome[]>}
 */
export async function replay(dlqTopic, messages) {
  /** @type {ReplayOutcome[]} */
  const outcomes = new Array(messages.length)
  /** @type {Map<string, { index: number, message: import('./api.js').ProduceMessage }[]>} */
  const byTopic = new Map()
  const { createdAt: dlqCreatedAt } = await api.topic(dlqTopic)
  const targets = await partitionCounts([...new Set(messages.map((m) => deadLetterInfo(m.headers).topic).filter((t) => t !== null))])
  messages.forEach((m, index) => {
    const topic = deadLetterInfo(m.headers).topic
    const r = replayOf(dlqTopic, dlqCreatedAt, m, topic === null ? undefined : targets.get(topic))
    if ('error' in r) {
      outcomes[index] = { ok: false, error: new Error(r.error) }
      return
    }
    const list = byTopic.get(r.topic) ?? []
    list.push({ index, message: r.message })
    byTopic.set(r.topic, list)
  })
  for (const [topic, list] of byTopic) {
    for (let i = 0; i < list.length; i += BATCH) {
      const batch = list.slice(i, i + BATCH)
      try {
        const { results } = await api.produce(
          topic,
          batch.map((b) => b.message),
        )
        batch.forEach((b, j) => {
          const r = results[j]
          outcomes[b.index] = r
            ? { ok: true, topic, partition: r.partition, offset: r.offset, duplicate: r.duplicate === true }
            : { ok: false, error: new Error('the broker answered without a result for this message') }
        })
      } catch (err) {
        for (const b of batch) outcomes[b.index] = { ok: false, error: err }
      }
    }
  }
  return outcomes
}

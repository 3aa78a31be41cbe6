// @ts-check
/**
 * Topics: every topic with its partitions' end offsets and its produce rate (msg/s), polled. The
 * rate is the growth of the summed end offsets over the last 10 s of samples.
 */
import { api } from './api.js'
import { errorPanel, fmtDuration, fmtInt, fmtRate, fmtTime, h, hashLink, replace, table } from './dom.js'
import { poll, topicCounter } from './samples.js'

// Topic details are fetched this many at a time, so a broker with many topics is not hit all at once.
const CONCURRENCY = 4

/**
 * Runs `fn` over `items`, at most `limit` at a time, results in order.
 * @template T, R
 * @param {T[]} items @param {number} limit @param {(item: T) => Promise<R>} fn
 * @returns {Promise<R[]>}
 */
export async function mapLimit(items, limit, fn) {
  /** @type {R[]} */
  const out = new Array(items.length)
  let next = 0
  const worker = async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await fn(/** @type {T} */ (items[i]))
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker))
  return out
}

/**
 * End offsets as text: `p0 3 · p1 1`, shortened past 8 partitions.
 * @param {{ partition: number, endOffset: number }[]} stats
 */
export function endOffsetsText(stats) {
  const shown = stats
    .slice(0, 8)
    .map((s) => `p${s.partition} ${fmtInt(s.endOffset)}`)
    .join(' · ')
  return stats.length > 8 ? `${shown} · … (${stats.length - 8} more)` : shown
}

/** @type {import('./app.js').View} */
export function topicsView(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'))
  replace(root, h('h1', {}, 'Topics'), body)

  return poll(async () => {
    try {
      const topics = await api.topics()
      const details = await mapLimit(topics, CONCURRENCY, (t) => api.topic(t.name))
      const nowMs = Date.now()
      const rows = details.map((t) => {
        const total = t.partitionStats.reduce((s, p) => s + p.endOffset, 0)
        const counter = topicCounter(t.name)
        counter.push(nowMs, total)
        return h(
          'tr',
          { 'data-topic': t.name },
          h('td', {}, h('a', { href: hashLink('topics', t.name) }, t.name)),
          h('td', { class: 'num' }, t.partitions),
          h('td', { class: 'end-offsets' }, endOffsetsText(t.partitionStats)),
          h('td', { class: 'num total' }, fmtInt(total)),
          h('td', { class: 'num rate' }, fmtRate(counter.rate())),
          h('td', {}, fmtDuration(t.retentionMs)),
          h('td', {}, fmtTime(t.createdAt)),
        )
      })
      replace(
        body,
        table(
          ['Topic', 'Partitions', 'End offsets', 'Produced', 'msg/s', 'Retention', 'Created'],
          rows,
          'No topics yet: create one with PUT /v1/topics/{topic}.',
          { class: 'topics' },
        ),
      )
    } catch (err) {
      replace(body, errorPanel(err))
    }
  })
}

// @ts-check
/**
 * Dead letters: the groups that have a dead-letter topic, and per group the latest messages of that
 * topic the group dead-lettered, with what the broker recorded (original topic, partition, offset,
 * attempts, last error) and Replay, for one message or all listed.
 */
import { api, ApiError } from './api.js'
import { errorPanel, fmtInt, fmtTime, h, hashLink, keyText, preview, replace, table } from './dom.js'
import { replay, deadLetterInfo, originalHeaders } from './replay.js'
import { headerList } from './topic.js'
import { mapLimit } from './topics.js'

// The newest this many messages of each dead-letter partition are read.
const PER_PARTITION = 100

/**
 * How many dead letters each group has in its dead-letter topic, counting a message only for the
 * group its hookq-dlq-group header names: groups may share a dead-letter topic, and a group that
 * never dead-lettered anything has none there, whatever the others put in it.
 * @param {{ name: string, deadLetterTopic: string | null }[]} groups
 * @param {Map<string, { messages: { headers: Record<string, string> }[], complete: boolean }>} read
 *   per dead-letter topic, the messages read and whether they are all the topic has
 * @returns {{ count: number, complete: boolean }[]} per group, in order
 */
export function deadLetterCounts(groups, read) {
  return groups.map((g) => {
    const topic = g.deadLetterTopic === null ? undefined : read.get(g.deadLetterTopic)
    if (topic === undefined) return { count: 0, complete: true }
    const count = topic.messages.filter((m) => deadLetterInfo(m.headers).group === g.name).length
    return { count, complete: topic.complete }
  })
}

/**
 * The newest PER_PARTITION messages of each partition of a dead-letter topic, and whether that is
 * all of them (a longer partition has older ones not read).
 * @param {string} dlq
 */
async function readNewest(dlq) {
  const topic = await api.topic(dlq)
  const pages = await mapLimit(topic.partitionStats, 4, (p) =>
    api.messages(dlq, p.partition, Math.max(0, p.endOffset - PER_PARTITION), PER_PARTITION),
  )
  return {
    messages: pages.flatMap((p) => p.messages),
    complete: topic.partitionStats.every((p) => p.endOffset <= PER_PARTITION),
  }
}

/** @type {import('./app.js').View} */
export function deadLettersIndexView(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'))
  replace(root, h('h1', {}, 'Dead letters'), body)
  void (async () => {
    try {
      const groups = (await api.groups()).filter((g) => g.deadLetterTopic !== null)
      const topics = [...new Set(groups.map((g) => /** @type {string} */ (g.deadLetterTopic)))]
      // A scoped key may see a group but not read its dead-letter topic (403): that count is unknown.
      const pages = await mapLimit(topics, 4, (t) =>
        readNewest(t).catch((err) => {
          if (err instanceof ApiError && err.status === 403) return null
          throw err
        }),
      )
      const unreadable = new Set(topics.filter((_, i) => pages[i] === null))
      const counts = deadLetterCounts(
        groups,
        new Map(
          topics.flatMap((t, i) => {
            const page = pages[i]
            return page ? [[t, page]] : []
          }),
        ),
      )
      replace(
        body,
        h(
          'p',
          { class: 'muted' },
          `Each group's dead letters: the messages of its dead-letter topic that it dead-lettered (a topic may serve several groups). `,
          `Counted in the newest ${PER_PARTITION} messages of each partition; "+" marks a topic with older ones.`,
        ),
        table(
          ['Group', 'Consumes', 'Dead-letter topic', 'Its dead letters', ''],
          groups.map((g, i) => {
            const c = counts[i] ?? { count: 0, complete: true }
            return h(
              'tr',
              { 'data-group': g.name },
              h('td', {}, h('a', { href: hashLink('groups', g.name) }, g.name)),
              h('td', {}, g.topic),
              h('td', {}, h('a', { href: hashLink('topics', /** @type {string} */ (g.deadLetterTopic)) }, g.deadLetterTopic)),
              unreadable.has(/** @type {string} */ (g.deadLetterTopic))
                ? h('td', { class: 'num dead-count', title: 'this API key may not read the dead-letter topic' }, '–')
                : h('td', { class: 'num dead-count' }, `${fmtInt(c.count)}${c.complete ? '' : '+'}`),
              h('td', {}, h('a', { href: hashLink('groups', g.name, 'dead-letters') }, 'Open')),
            )
          }),
          'No group has a deadLetterTopic. Without one, dead messages are only recorded in the delivery log (outcome dead).',
        ),
      )
    } catch (err) {
      replace(body, errorPanel(err))
    }
  })()
}

/**
 * The text of a replay's outcome.
 * @param {import('./replay.js').ReplayOutcome} o
 */
function outcomeNode(o) {
  if (!o.ok) return h('span', { class: 'error-text' }, o.error instanceof Error ? o.error.message : String(o.error))
  const where = `${o.topic} p${o.partition} @ ${o.offset}`
  return o.duplicate
    ? h('span', { class: 'muted replayed' }, `already replayed (${where})`)
    : h('span', { class: 'ok-text replayed' }, `replayed → ${where}`)
}

/** @type {import('./app.js').View} */
export function deadLettersView(root, [name = '']) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'))
  replace(
    root,
    h(
      'p',
      { class: 'crumbs' },
      h('a', { href: '#/dead-letters' }, 'Dead letters'),
      ' / ',
      h('a', { href: hashLink('groups', name) }, name),
      ' / ',
    ),
    h('h1', {}, `Dead letters of ${name}`),
    body,
  )

  let stopped = false
  const load = async () => {
    replace(body, h('p', { class: 'muted' }, 'Loading…'))
    try {
      const group = await api.group(name)
      const dlq = group.deadLetterTopic
      if (dlq === null) {
        replace(
          body,
          h(
            'p',
            {},
            'This group has no deadLetterTopic: its dead messages are recorded in the ',
            h('a', { href: `${hashLink('groups', name, 'deliveries')}?outcome=dead` }, 'delivery log'),
            ' only.',
          ),
        )
        return
      }
      const topic = await api.topic(dlq)
      const pages = await mapLimit(topic.partitionStats, 4, (p) =>
        api.messages(dlq, p.partition, Math.max(0, p.endOffset - PER_PARTITION), PER_PARTITION),
      )
      if (stopped) return
      const all = pages.flatMap((p) => p.messages)
      // A dead-letter topic may be shared by several groups; list this group's only.
      const mine = all
        .filter((m) => deadLetterInfo(m.headers).group === name)
        .sort((a, b) => b.timestamp.localeCompare(a.timestamp) || b.partition - a.partition || b.offset - a.offset)
      render(dlq, mine, all.length - mine.length)
    } catch (err) {
      replace(body, errorPanel(err))
    }
  }

  /**
   * @param {string} dlq
   * @param {import('./api.js').Message[]} messages
   * @param {number} others messages of other groups left out
   */
  const render = (dlq, messages, others) => {
    /** @type {HTMLTableCellElement[]} */
    const resultCells = []
    /** @type {HTMLButtonElement[]} */
    const buttons = []
    /** @param {number[]} indexes */
    const run = async (indexes) => {
      for (const i of indexes) {
        const b = buttons[i]
        if (b) b.disabled = true
      }
      try {
        const outcomes = await replay(
          dlq,
          indexes.map((i) => /** @type {import('./api.js').Message} */ (messages[i])),
        )
        outcomes.forEach((o, j) => {
          const cell = resultCells[/** @type {number} */ (indexes[j])]
          if (cell) replace(cell, outcomeNode(o))
        })
      } finally {
        for (const i of indexes) {
          const b = buttons[i]
          if (b) b.disabled = false
        }
      }
    }
    const rows = messages.map((m, i) => {
      const info = deadLetterInfo(m.headers)
      const button = h('button', { type: 'button', class: 'replay', disabled: info.topic === null, onclick: () => void run([i]) }, 'Replay')
      const result = h('td', { class: 'result' })
      buttons.push(button)
      resultCells.push(result)
      return h(
        'tr',
        { 'data-dlq-partition': m.partition, 'data-dlq-offset': m.offset },
        h('td', {}, fmtTime(m.timestamp)),
        h('td', { class: 'num' }, `p${m.partition} @ ${m.offset}`),
        h(
          'td',
          { class: 'original' },
          info.topic === null
            ? h('span', { class: 'muted' }, 'unknown')
            : [h('a', { href: hashLink('topics', info.topic) }, info.topic), ` p${info.partition ?? '?'} @ ${info.offset ?? '?'}`],
        ),
        h('td', { class: 'num attempts' }, info.attempts ?? '–'),
        h('td', { class: 'error-cell' }, info.error ?? ''),
        h('td', {}, keyText(m.key)),
        h('td', {}, h('pre', { class: 'value' }, preview(m.value, 200))),
        h('td', {}, headerList(originalHeaders(m.headers))),
        h('td', {}, button),
        result,
      )
    })
    const replayAll = h(
      'button',
      {
        type: 'button',
        class: 'replay-all',
        disabled: messages.length === 0,
        onclick: () => {
          if (
            !window.confirm(
              `Replay all ${messages.length} listed dead letters to their original topics? Ones already replayed are not stored again.`,
            )
          )
            return
          void run(messages.map((_, i) => i))
        },
      },
      `Replay all listed (${messages.length})`,
    )
    replace(
      body,
      h(
        'p',
        {},
        'Dead-letter topic ',
        h('a', { href: hashLink('topics', dlq) }, dlq),
        `: the newest ${PER_PARTITION} messages of each partition, this group's ${fmtInt(messages.length)}`,
        others > 0 ? ` (${fmtInt(others)} of other groups left out)` : '',
        '. Replay produces a message back to its original topic and partition ',
        'without the hookq-dlq-* headers; replaying one twice stores it once.',
      ),
      h('div', { class: 'toolbar' }, replayAll, h('button', { type: 'button', onclick: () => void load() }, 'Refresh')),
      table(
        ['Dead-lettered', 'In DLQ', 'Original', 'Attempts', 'Last error', 'Key', 'Value', 'Headers', 'Replay', 'Result'],
        rows,
        'No dead letters of this group.',
        { class: 'dead-letters' },
      ),
    )
  }

  void load()
  return () => {
    stopped = true
  }
}

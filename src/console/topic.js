// @ts-check
/**
 * One topic: its partitions' end offsets (polled), the groups consuming it, and a partition's
 * messages read through the fetch route, newest page first with older and newer pages.
 */
import { api } from './api.js'
import { errorPanel, fmtBytes, fmtDuration, fmtInt, fmtRate, fmtTime, h, hashLink, keyText, preview, replace, table } from './dom.js'
import { poll, topicCounter } from './samples.js'

const PAGE = 20

/**
 * A message's headers as `name: value` lines.
 * @param {Record<string, string>} headers
 */
export function headerList(headers) {
  const entries = Object.entries(headers)
  if (entries.length === 0) return h('span', { class: 'muted' }, '–')
  return h(
    'ul',
    { class: 'headers' },
    entries.map(([k, v]) => h('li', {}, h('code', {}, k), ': ', v)),
  )
}

/**
 * Rows of fetched messages, newest first.
 * @param {import('./api.js').Message[]} messages
 */
export function messageRows(messages) {
  return [...messages]
    .reverse()
    .map((m) =>
      h(
        'tr',
        { 'data-offset': m.offset },
        h('td', { class: 'num' }, m.offset),
        h('td', {}, fmtTime(m.timestamp)),
        h('td', {}, keyText(m.key)),
        h('td', {}, headerList(m.headers)),
        h('td', {}, h('pre', { class: 'value' }, preview(m.value))),
      ),
    )
}

/**
 * What the topic keeps: its messages, the oldest one's produce time, and about how much disk they take.
 * @param {import('./api.js').TopicStorage} s
 */
export function storageLine(s) {
  const oldest = s.oldestMessageAt === null ? 'none kept' : `oldest ${fmtTime(s.oldestMessageAt)}`
  return `Keeps ${fmtInt(s.messages)} message${s.messages === 1 ? '' : 's'} (${oldest}) · about ${fmtBytes(s.approxBytes)} on disk`
}

/** @type {import('./app.js').View} */
export function topicView(root, [name = '']) {
  const summary = h('p', { class: 'muted' }, 'Loading…')
  const kept = h('p', { class: 'muted storage' })
  const partitions = h('div')
  const groups = h('div')
  const messages = h('div', { class: 'messages' })
  replace(
    root,
    h('p', { class: 'crumbs' }, h('a', { href: '#/topics' }, 'Topics'), ' / '),
    h('h1', {}, name),
    summary,
    kept,
    h('h2', {}, 'Partitions'),
    partitions,
    h('h2', {}, 'Consumer groups'),
    groups,
    h('h2', {}, 'Messages'),
    messages,
  )

  /** @type {number[]} end offsets by partition, from the last poll */
  let ends = []
  let partition = 0
  let shown = false
  // Only the latest request draws: a slow answer for a page left behind must not replace a newer one.
  let request = 0

  /** Shows a page of `partition` starting at `fromOffset`. @param {number} fromOffset */
  const showMessages = async (fromOffset) => {
    shown = true
    const mine = ++request
    replace(messages, h('p', { class: 'muted' }, 'Loading…'))
    try {
      const page = await api.messages(name, partition, fromOffset, PAGE)
      if (mine !== request) return
      const end = ends[partition] ?? page.nextOffset
      replace(
        messages,
        h(
          'div',
          { class: 'toolbar' },
          h('strong', {}, `Partition ${partition}`),
          ` offsets ${fmtInt(fromOffset)} to ${fmtInt(Math.max(fromOffset, page.nextOffset - 1))} of ${fmtInt(end)}`,
          h('button', { type: 'button', disabled: fromOffset === 0, onclick: () => showMessages(Math.max(0, fromOffset - PAGE)) }, 'Older'),
          h('button', { type: 'button', disabled: page.nextOffset >= end, onclick: () => showMessages(page.nextOffset) }, 'Newer'),
          h('button', { type: 'button', onclick: () => showMessages(Math.max(0, (ends[partition] ?? 0) - PAGE)) }, 'Latest'),
        ),
        table(
          ['Offset', 'Produced', 'Key', 'Headers', 'Value'],
          messageRows(page.messages),
          'No messages in this range (retention may have removed them).',
          { class: 'message-list' },
        ),
      )
    } catch (err) {
      if (mine === request) replace(messages, errorPanel(err))
    }
  }

  const stopPolling = poll(async () => {
    try {
      const t = await api.topic(name)
      ends = t.partitionStats.map((p) => p.endOffset)
      const counter = topicCounter(name)
      counter.push(
        Date.now(),
        ends.reduce((s, e) => s + e, 0),
      )
      replace(
        summary,
        `${t.partitions} partition${t.partitions === 1 ? '' : 's'} · retention ${fmtDuration(t.retentionMs)} · `,
        `${fmtRate(counter.rate())} msg/s · created ${fmtTime(t.createdAt)}`,
      )
      replace(kept, t.storage ? storageLine(t.storage) : '')
      replace(
        partitions,
        table(
          ['Partition', 'Oldest kept', 'End offset', ''],
          t.partitionStats.map((p) =>
            h(
              'tr',
              { 'data-partition': p.partition },
              h('td', { class: 'num' }, p.partition),
              h('td', { class: 'num' }, p.startOffset === undefined ? '–' : fmtInt(p.startOffset)),
              h('td', { class: 'num' }, fmtInt(p.endOffset)),
              h(
                'td',
                {},
                h(
                  'button',
                  {
                    type: 'button',
                    class: 'link',
                    onclick: () => {
                      partition = p.partition
                      void showMessages(Math.max(0, p.endOffset - PAGE))
                    },
                  },
                  'Show messages',
                ),
              ),
            ),
          ),
          '',
          { class: 'partitions' },
        ),
      )
      if (!shown) void showMessages(Math.max(0, (ends[0] ?? 0) - PAGE))
    } catch (err) {
      replace(summary, errorPanel(err))
    }
  })

  api.groups().then(
    (all) => {
      const mine = all.filter((g) => g.topic === name)
      replace(
        groups,
        mine.length === 0
          ? h('p', { class: 'muted' }, 'No group consumes this topic.')
          : h(
              'ul',
              {},
              mine.map((g) => h('li', {}, h('a', { href: hashLink('groups', g.name) }, g.name))),
            ),
      )
    },
    (err) => replace(groups, errorPanel(err)),
  )

  return stopPolling
}

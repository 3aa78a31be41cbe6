// @ts-check
/**
 * One group: the lag and throughput chart, per-partition committed offset, end offset, lag, in
 * flight and consumer, the consumers and their health, its settings, pause/resume, and seek.
 * Polled every 2 s; each poll adds a point to the chart's history.
 */
import { api } from './api.js'
import { lagChart } from './chart.js'
import { badge, errorPanel, fmtDuration, fmtInt, fmtTime, h, hashLink, replace, shortId, table } from './dom.js'
import { consumerHealth } from './groups.js'
import { groupHistory, poll } from './samples.js'
import { seekForm } from './seek.js'

/**
 * The partitions table.
 * @param {import('./api.js').GroupStatus} g
 */
function partitionsTable(g) {
  const consumers = new Map(g.consumers.map((c) => [c.id, c]))
  const rows = g.partitions.map((p) => {
    const c = p.consumerId === null ? undefined : consumers.get(p.consumerId)
    return h(
      'tr',
      { 'data-partition': p.partition },
      h('td', { class: 'num' }, p.partition),
      h('td', { class: 'num committed' }, fmtInt(p.committedOffset)),
      h('td', { class: 'num end' }, fmtInt(p.endOffset)),
      h('td', { class: `num lag${p.lag > 0 ? ' hot' : ''}` }, fmtInt(p.lag)),
      h('td', { class: 'num in-flight' }, fmtInt(p.inFlight)),
      h('td', { class: 'num filtered' }, fmtInt(p.filtered)),
      h('td', { class: 'consumer' }, c ? [shortId(c.id), ' ', h('span', { class: 'muted' }, c.url)] : badge('unassigned', 'warn')),
      h('td', {}, h('a', { href: `${hashLink('groups', g.name, 'deliveries')}?partition=${p.partition}` }, 'attempts')),
    )
  })
  return table(
    ['Partition', 'Committed', 'End offset', 'Lag', 'In flight', 'Filtered', 'Consumer', ''],
    rows,
    'The topic has no partitions.',
    { class: 'partitions' },
  )
}

/**
 * The consumers table: enabled, or disabled (410 Gone) with the reason.
 * @param {import('./api.js').GroupStatus} g
 */
function consumersTable(g) {
  const rows = g.consumers.map((c) =>
    h(
      'tr',
      { 'data-consumer': c.id },
      h('td', {}, shortId(c.id)),
      h('td', {}, h('code', {}, c.url)),
      h('td', { class: 'health' }, c.disabled ? [badge('disabled', 'bad'), ' ', c.disabledReason ?? ''] : healthCell(c.health)),
      h('td', {}, c.hasSecret ? 'signed' : h('span', { class: 'muted' }, 'unsigned')),
      h('td', { class: 'auth' }, authText(c.auth)),
      h('td', { class: 'limits' }, limitsText(c)),
      h('td', { class: 'num' }, g.partitions.filter((p) => p.consumerId === c.id).length),
      h('td', {}, fmtTime(c.createdAt)),
    ),
  )
  return table(
    ['Consumer', 'URL', 'Health', 'Signature', 'Auth', 'Limits', 'Partitions', 'Registered'],
    rows,
    'No consumers: register one with POST /v1/groups/{group}/consumers.',
    { class: 'consumers' },
  )
}

/**
 * A consumer's push authentication: its type and header names or client id; the broker never
 * sends a secret value, so there is none to hide here.
 * @param {import('./api.js').PushAuthView | undefined} auth
 */
function authText(auth) {
  if (!auth) return h('span', { class: 'muted' }, 'none')
  if (auth.type === 'headers') return `headers: ${auth.headerNames.join(', ')}`
  if (auth.type === 'jwt') return auth.audience ? `JWT (aud ${auth.audience})` : 'JWT'
  return `OAuth 2.0: ${auth.clientId}`
}

/**
 * An enabled consumer's health, as Svix and Convoy show it: failing when most recent pushes failed,
 * degraded when some did, with the last error and when things last went right and wrong.
 * @param {import('./api.js').ConsumerHealth} health
 */
function healthCell(health) {
  const rate = health.recentFailureRate
  const state =
    rate === null
      ? badge('enabled', 'ok')
      : rate >= 0.5
        ? badge(`failing ${Math.round(rate * 100)}%`, 'bad')
        : rate > 0
          ? badge(`degraded ${Math.round(rate * 100)}%`, 'warn')
          : badge('healthy', 'ok')
  const lines = [
    health.lastSuccessAt ? `last success ${fmtTime(health.lastSuccessAt)}` : '',
    health.lastFailureAt ? `last failure ${fmtTime(health.lastFailureAt)}: ${health.lastError ?? ''}` : '',
  ].filter(Boolean)
  return [state, ...lines.map((l) => h('div', { class: 'muted small' }, l))]
}

/**
 * A consumer's fixed limits, or the adaptive window alone.
 * @param {{ rateLimitPerSecond: number | null, maxConcurrency: number | null }} c
 */
function limitsText(c) {
  const parts = [
    c.rateLimitPerSecond === null ? '' : `${c.rateLimitPerSecond}/s`,
    c.maxConcurrency === null ? '' : `≤ ${c.maxConcurrency} at once`,
  ]
  return parts.filter(Boolean).join(', ') || 'adaptive'
}

/** The settings as a definition list. @param {import('./api.js').GroupStatus} g */
function settings(g) {
  /** @type {[string, string][]} */
  const items = [
    ['Delivery', g.delivery],
    ['Ack mode', g.ackMode],
    ['Ack timeout', fmtDuration(g.ackTimeoutMs)],
    ['Max deliveries', String(g.maxDeliveries)],
    [
      'Retry',
      `${fmtDuration(g.retry.initialDelayMs)} × ${g.retry.multiplier}^n, at most ${fmtDuration(g.retry.maxDelayMs)}, ±${Math.round(g.retry.jitter * 100)}%`,
    ],
    ['Max in flight', `${g.maxInFlight} a partition`],
    [
      'Ordering',
      { none: 'none (in parallel)', partition: 'by partition (one message at a time)', key: 'by key (one message per key at a time)' }[
        g.ordering
      ],
    ],
    ['Push timeout', fmtDuration(g.pushTimeoutMs)],
    ['Push format', g.pushFormat],
    ['Start at', g.startAt],
    ['Dead-letter topic', g.deadLetterTopic ?? 'none (recorded as dead)'],
    ['Filter', g.filter ? JSON.stringify(g.filter) : 'none (every message is pushed)'],
    [
      'Batch push',
      g.batch
        ? `up to ${g.batch.maxMessages} messages, wait ${fmtDuration(g.batch.maxWaitMs)}${g.batch.maxBytes === null ? '' : `, ≤ ${g.batch.maxBytes} bytes`}`
        : 'off (one message a push)',
    ],
  ]
  return h(
    'dl',
    { class: 'settings' },
    items.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
  )
}

/** @type {import('./app.js').View} */
export function groupView(root, [name = '']) {
  const header = h('div', { class: 'toolbar' }, h('span', { class: 'muted' }, 'Loading…'))
  const chartBox = h('div', { class: 'chart-box' })
  const chartNote = h('p', { class: 'muted small chart-note' })
  const partitions = h('div')
  const consumers = h('div')
  const config = h('div')
  const seekBox = h('div')
  const problem = h('div')
  replace(
    root,
    h('p', { class: 'crumbs' }, h('a', { href: '#/groups' }, 'Groups'), ' / '),
    h('h1', {}, name),
    header,
    problem,
    h('h2', {}, 'Lag and throughput'),
    h('p', { class: 'muted small' }, 'Sampled every 2 s while this page is open; the last 10 minutes.'),
    chartBox,
    chartNote,
    h('h2', {}, 'Partitions'),
    partitions,
    h('h2', {}, 'Consumers'),
    consumers,
    h('h2', {}, 'Seek'),
    seekBox,
    h('h2', {}, 'Settings'),
    config,
  )

  const chart = lagChart(chartBox)
  const history = groupHistory(name)
  // A fresh page has one sample or none: an empty frame, not a flat line that reads as "no lag, ever".
  const drawChart = () => {
    const data = history.data()
    chart.update(data)
    replace(chartNote, data[0].length < 2 ? 'Collecting samples: the lines start with the second one, 2 s after the first.' : '')
  }
  drawChart()
  /** @type {import('./api.js').GroupStatus | undefined} */
  let current
  let seekShown = false

  const togglePause = async () => {
    if (!current) return
    try {
      await api.putGroup(name, { topic: current.topic, paused: !current.paused })
      await refresh()
    } catch (err) {
      replace(problem, errorPanel(err))
    }
  }

  const refresh = async () => {
    try {
      const g = await api.group(name)
      current = g
      history.push(Date.now(), g.partitions)
      drawChart()
      replace(problem)
      const lag = g.partitions.reduce((s, p) => s + p.lag, 0)
      replace(
        header,
        'Topic ',
        h('a', { href: hashLink('topics', g.topic) }, g.topic),
        ' · ',
        h('span', { class: 'total-lag' }, `lag ${fmtInt(lag)}`),
        ' · ',
        consumerHealth(g.consumers),
        ' ',
        g.paused ? badge('paused', 'warn') : badge('active', 'ok'),
        h('button', { type: 'button', class: 'pause', onclick: togglePause }, g.paused ? 'Resume' : 'Pause'),
        h('a', { class: 'button', href: hashLink('groups', name, 'deliveries') }, 'Delivery log'),
        g.deadLetterTopic ? h('a', { class: 'button', href: hashLink('groups', name, 'dead-letters') }, 'Dead letters') : null,
      )
      replace(partitions, partitionsTable(g))
      replace(consumers, consumersTable(g))
      replace(config, settings(g))
      // The form is built once: rebuilding it on every poll would wipe what the user is typing.
      if (!seekShown) {
        seekShown = true
        replace(
          seekBox,
          seekForm(name, g.partitions.length, () => void refresh()),
        )
      }
    } catch (err) {
      replace(problem, errorPanel(err))
    }
  }

  const stopPolling = poll(refresh)
  return () => {
    stopPolling()
    chart.destroy()
  }
}

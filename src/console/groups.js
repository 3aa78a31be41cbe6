// @ts-check
/**
 * Consumer groups: each with its topic, total lag and in-flight count, and the health of its
 * consumers (enabled, or disabled after a 410 Gone), polled.
 */
import { api } from './api.js'
import { badge, errorPanel, fmtInt, h, hashLink, replace, table } from './dom.js'
import { poll } from './samples.js'
import { mapLimit } from './topics.js'

/**
 * The group's consumers in words: how many, and of them how many are ok, failing (most of their
 * pushes of the last 5 minutes failed) or disabled (after a 410 Gone). The parts add up to the
 * total, so one failing consumer reads "1 consumer, failing", not as two consumers; and a tone:
 * bad when none is ok, warn when some are not.
 * @param {{ disabled?: boolean, health: { recentFailureRate?: number | null } }[]} consumers
 * @returns {{ text: string, tone: 'ok' | 'warn' | 'bad' }}
 */
export function consumerSummary(consumers) {
  const total = consumers.length
  if (total === 0) return { text: 'no consumer', tone: 'warn' }
  const disabled = consumers.filter((c) => c.disabled).length
  const failing = consumers.filter((c) => !c.disabled && (c.health.recentFailureRate ?? 0) >= 0.5).length
  const ok = total - disabled - failing
  const tone = ok === 0 ? 'bad' : ok < total ? 'warn' : 'ok'
  if (total === 1) return { text: `1 consumer${failing ? ', failing' : disabled ? ', disabled' : ''}`, tone }
  const parts = [ok ? `${ok} ok` : '', failing ? `${failing} failing` : '', disabled ? `${disabled} disabled` : ''].filter(Boolean)
  return { text: ok === total ? `${total} consumers` : `${total} consumers: ${parts.join(', ')}`, tone }
}

/** consumerSummary as a badge. @param {import('./api.js').GroupStatus['consumers']} consumers */
export function consumerHealth(consumers) {
  const { text, tone } = consumerSummary(consumers)
  return badge(text, tone)
}

/** @type {import('./app.js').View} */
export function groupsView(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'))
  replace(root, h('h1', {}, 'Consumer groups'), body)

  return poll(async () => {
    try {
      const groups = await api.groups()
      const statuses = await mapLimit(groups, 4, (g) => api.group(g.name))
      const rows = statuses.map((g) =>
        h(
          'tr',
          { 'data-group': g.name },
          h('td', {}, h('a', { href: hashLink('groups', g.name) }, g.name)),
          h('td', {}, h('a', { href: hashLink('topics', g.topic) }, g.topic)),
          h('td', { class: 'num lag' }, fmtInt(g.partitions.reduce((s, p) => s + p.lag, 0))),
          h('td', { class: 'num' }, fmtInt(g.partitions.reduce((s, p) => s + p.inFlight, 0))),
          h('td', { class: 'consumer-health' }, consumerHealth(g.consumers)),
          h('td', {}, g.paused ? badge('paused', 'warn') : badge('active', 'ok')),
          h(
            'td',
            {},
            g.deadLetterTopic
              ? h('a', { href: hashLink('groups', g.name, 'dead-letters') }, g.deadLetterTopic)
              : h('span', { class: 'muted' }, '–'),
          ),
        ),
      )
      replace(
        body,
        table(
          ['Group', 'Topic', 'Lag', 'In flight', 'Consumers', 'State', 'Dead letters'],
          rows,
          'No groups yet: create one with PUT /v1/groups/{group}.',
          { class: 'groups' },
        ),
      )
    } catch (err) {
      replace(body, errorPanel(err))
    }
  })
}

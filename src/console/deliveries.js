// @ts-check
/**
 * A group's delivery attempt log, newest first: filters by partition, offset and outcome (kept in
 * the URL, so a filtered view can be linked), and "Load more" through nextCursor.
 */
import { api } from './api.js'
import { badge, errorPanel, fmtInt, fmtTime, h, hashLink, replace, shortId } from './dom.js'

const PAGE = 50
const OUTCOMES = ['acked', 'failed', 'timed_out', 'nacked', 'dead', 'in_flight']
/** @type {Record<string, string>} */
const OUTCOME_KIND = { acked: 'ok', in_flight: 'info', failed: 'warn', timed_out: 'warn', nacked: 'warn', dead: 'bad' }

/** @param {import('./api.js').Delivery} d */
function deliveryRow(d) {
  return h(
    'tr',
    { 'data-delivery': d.deliveryId, 'data-outcome': d.outcome },
    h('td', {}, fmtTime(d.startedAt)),
    h('td', { class: 'num' }, d.partition),
    h('td', { class: 'num' }, d.offset),
    h('td', { class: 'num' }, d.attempt),
    h('td', { class: 'outcome' }, badge(d.outcome, OUTCOME_KIND[d.outcome] ?? 'info')),
    h('td', { class: 'num' }, d.statusCode ?? '–'),
    h('td', { class: 'num' }, d.durationMs === null ? '–' : `${fmtInt(d.durationMs)} ms`),
    h('td', { class: 'error-cell' }, d.error ?? ''),
    h('td', {}, shortId(d.consumerId)),
    h('td', {}, shortId(d.deliveryId)),
  )
}

/**
 * A whole number from a query or form value, or undefined.
 * @param {string | null} v
 */
function wholeNumber(v) {
  return v !== null && /^\d+$/.test(v.trim()) ? Number(v.trim()) : undefined
}

/** @type {import('./app.js').View} */
export function deliveriesView(root, [name = ''], query) {
  const filters = {
    partition: wholeNumber(query.get('partition')),
    offset: wholeNumber(query.get('offset')),
    outcome: OUTCOMES.includes(query.get('outcome') ?? '') ? /** @type {string} */ (query.get('outcome')) : undefined,
  }
  const partition = h('input', { name: 'partition', type: 'number', min: 0, placeholder: 'any', value: filters.partition })
  const offset = h('input', { name: 'offset', type: 'number', min: 0, placeholder: 'any', value: filters.offset })
  const outcome = h(
    'select',
    { name: 'outcome' },
    h('option', { value: '' }, 'any outcome'),
    OUTCOMES.map((o) => h('option', { value: o, selected: o === filters.outcome }, o)),
  )
  const form = h(
    'form',
    { class: 'inline-form filters' },
    h('label', {}, 'Partition ', partition),
    h('label', {}, 'Offset ', offset),
    h('label', {}, 'Outcome ', outcome),
    h('button', { type: 'submit' }, 'Apply'),
    h(
      'button',
      {
        type: 'button',
        onclick: () => {
          location.hash = hashLink('groups', name, 'deliveries')
        },
      },
      'Clear',
    ),
  )
  form.addEventListener('submit', (ev) => {
    ev.preventDefault()
    const q = new URLSearchParams()
    if (partition.value !== '') q.set('partition', partition.value)
    if (offset.value !== '') q.set('offset', offset.value)
    if (outcome.value !== '') q.set('outcome', outcome.value)
    const target = `${hashLink('groups', name, 'deliveries')}${q.size > 0 ? `?${q}` : ''}`
    // The same hash fires no hashchange: reload by hand.
    if (location.hash === target) load(undefined)
    else location.hash = target
  })

  const tbody = h('tbody')
  const list = h(
    'table',
    { class: 'deliveries' },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        ['Started', '#Partition', '#Offset', '#Attempt', 'Outcome', '#Status', '#Duration', 'Error', 'Consumer', 'Delivery'].map((t) =>
          t.startsWith('#') ? h('th', { class: 'num' }, t.slice(1)) : h('th', {}, t),
        ),
      ),
    ),
    tbody,
  )
  const more = h('div', { class: 'more' })
  replace(
    root,
    h('p', { class: 'crumbs' }, h('a', { href: '#/groups' }, 'Groups'), ' / ', h('a', { href: hashLink('groups', name) }, name), ' / '),
    h('h1', {}, 'Delivery log'),
    h('p', { class: 'muted' }, 'Every push attempt of the group, newest first.'),
    form,
    list,
    more,
  )

  let stopped = false
  /** Loads a page; no cursor means the first page (the table is emptied). @param {string | undefined} cursor */
  const load = async (cursor) => {
    replace(more, h('span', { class: 'muted' }, 'Loading…'))
    try {
      const page = await api.deliveries(name, { ...filters, limit: PAGE, cursor })
      if (stopped) return
      if (cursor === undefined) tbody.replaceChildren()
      for (const d of page.deliveries) tbody.appendChild(deliveryRow(d))
      if (tbody.children.length === 0) tbody.appendChild(h('tr', {}, h('td', { class: 'empty', colspan: 10 }, 'No attempts match.')))
      const next = page.nextCursor
      replace(
        more,
        next === null
          ? h('span', { class: 'muted' }, `${fmtInt(tbody.querySelectorAll('tr[data-delivery]').length)} attempts shown, no more.`)
          : h('button', { type: 'button', class: 'load-more', onclick: () => load(next) }, 'Load more'),
      )
    } catch (err) {
      replace(more, errorPanel(err))
    }
  }
  void load(undefined)
  return () => {
    stopped = true
  }
}

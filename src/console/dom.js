// @ts-check
/**
 * Building the page without innerHTML: every piece of data goes in as a text node or an attribute
 * value, so a topic named `<img onerror=...>` stays text. Plus the formatting the views share.
 */
import { ApiError } from './api.js'

/** @typedef {string | number | Node | null | undefined | false} Child */
/** @typedef {Record<string, string | number | boolean | null | undefined | ((ev: any) => void)>} Attrs */

/**
 * Creates an element. Attributes: `class`, `on<event>` listeners, booleans as present/absent,
 * anything else through setAttribute. Children: nodes, or text (numbers included); null, undefined
 * and false are skipped.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue
    if (typeof value === 'function') el.addEventListener(name.slice(2), value)
    else if (name === 'class') el.className = String(value)
    else el.setAttribute(name, value === true ? '' : String(value))
  }
  append(el, children)
  return el
}

/**
 * @param {Node} parent
 * @param {(Child | Child[])[]} children
 */
function append(parent, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    parent.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)))
  }
}

/**
 * Replaces an element's children.
 * @param {Element} el
 * @param {...(Child | Child[])} children
 */
export function replace(el, ...children) {
  el.replaceChildren()
  append(el, children)
}

/** A link inside the console: `#/` plus path segments, each URI-encoded. @param {...string} segments */
export function hashLink(...segments) {
  return `#/${segments.map(encodeURIComponent).join('/')}`
}

/**
 * A table with a header row; rows are built by the caller.
 * @param {string[]} headings
 * @param {HTMLTableRowElement[]} rows
 * @param {string} [empty] what to say when there are no rows
 * @param {Attrs} [attrs]
 */
export function table(headings, rows, empty = 'Nothing yet.', attrs = {}) {
  const body = rows.length > 0 ? rows : [h('tr', {}, h('td', { class: 'empty', colspan: headings.length }, empty))]
  // A heading aligns like its column: right over numbers (cells with class num).
  const first = rows[0]
  const num = (/** @type {number} */ i) => (first?.children[i]?.classList.contains('num') ? 'num' : undefined)
  return h(
    'table',
    attrs,
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        headings.map((t, i) => h('th', { class: num(i) }, t)),
      ),
    ),
    h('tbody', {}, body),
  )
}

/** A coloured label. @param {string} text @param {string} kind */
export function badge(text, kind) {
  return h('span', { class: `badge badge-${kind}` }, text)
}

/**
 * An error as a readable panel: problem documents show title, code, detail and field errors.
 * @param {unknown} err
 */
export function errorPanel(err) {
  if (err instanceof ApiError) {
    const fields = err.problem.errors ?? []
    return h(
      'div',
      { class: 'error', role: 'alert' },
      h('strong', {}, err.problem.title ?? 'Request failed'),
      ` (${err.status}${err.problem.code ? `, ${err.problem.code}` : ''})`,
      err.problem.detail ? h('div', {}, err.problem.detail) : null,
      fields.length > 0
        ? h(
            'ul',
            {},
            fields.map((f) => h('li', {}, `${f.path}: ${f.message}`)),
          )
        : null,
      err.status === 401 ? h('div', {}, 'Enter an API key above to continue.') : null,
      err.status === 403
        ? h('div', {}, "This API key's scopes do not cover this: it sees and changes only the topics and groups they name.")
        : null,
    )
  }
  return h('div', { class: 'error', role: 'alert' }, h('strong', {}, 'Error'), ': ', String(err instanceof Error ? err.message : err))
}

const integer = new Intl.NumberFormat('en-US')

/** @param {number} n */
export function fmtInt(n) {
  return integer.format(n)
}

/** Messages a second, one decimal below 10. @param {number | null} perS */
export function fmtRate(perS) {
  if (perS === null) return '–'
  return perS < 10 ? perS.toFixed(1) : integer.format(Math.round(perS))
}

/** A local date and time, to the second. @param {string | null} iso */
export function fmtTime(iso) {
  if (!iso) return '–'
  const d = new Date(iso)
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString('sv-SE') // sv-SE: an ISO-like 2026-01-31 14:05:09
}

/**
 * Tick steps for an axis that counts things (1, 2, 5, 10, 20, 50, …): no tick at 0.2 of a message,
 * as uPlot's default steps drew on a lag axis from 0 to 1.
 */
export const COUNT_STEPS = Array.from({ length: 13 }, (_, e) => [1, 2, 5].map((m) => m * 10 ** e)).flat()

/**
 * Labels of a time axis (splits in seconds since the epoch) in fmtTime's ISO form: 14:05, or
 * 14:05:09 for steps under a minute, with the date (2026-01-31) under the first tick and where the
 * day changes (uPlot's defaults wrote it the US way, 1/31, beside ISO dates elsewhere).
 * @param {number[]} splits @param {number} stepSeconds
 */
export function timeTickLabels(splits, stepSeconds) {
  let lastDay = ''
  return splits.map((s) => {
    const [day = '', time = ''] = new Date(s * 1000).toLocaleString('sv-SE').split(' ')
    const clock = stepSeconds < 60 ? time : time.slice(0, 5)
    const label = day === lastDay ? clock : `${clock}\n${day}`
    lastDay = day
    return label
  })
}

/** A duration in ms as the largest whole unit that fits (7 d, 3 h, 20 min, 5 s, 250 ms). @param {number} ms */
export function fmtDuration(ms) {
  for (const [unit, size] of /** @type {const} */ ([
    ['d', 86_400_000],
    ['h', 3_600_000],
    ['min', 60_000],
    ['s', 1000],
  ])) {
    if (ms >= size && ms % size === 0) return `${ms / size} ${unit}`
  }
  return `${fmtInt(ms)} ms`
}

/** Bytes in the largest binary unit under 1024 of it, one decimal below 10 (512 B, 3.4 MiB, 120 GiB). @param {number} bytes */
export function fmtBytes(bytes) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let n = bytes
  let i = 0
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024
    i++
  }
  return `${i === 0 || n >= 10 ? Math.round(n) : n.toFixed(1)} ${units[i]}`
}

/** Compact JSON for display, cut at `max` characters. @param {unknown} value @param {number} [max] */
export function preview(value, max = 300) {
  let text
  try {
    text = JSON.stringify(value) ?? String(value)
  } catch {
    text = '(nested too deeply to show)' // deeper than JSON.stringify's stack
  }
  return text.length > max ? `${text.slice(0, max)}…` : text
}

/** A message key: code, cut at 40 characters (the whole key in the title), or a muted null. @param {string | null} key */
export function keyText(key) {
  if (key === null) return h('span', { class: 'muted', title: 'no key' }, '–') // as a missing header or value elsewhere
  return h('code', { class: 'key', title: key.length > 40 ? key : undefined }, key.length > 40 ? `${key.slice(0, 40)}…` : key)
}

/**
 * An id cut to its first 4 and last 6 characters: ids made by one process share a long prefix
 * (delivery ids do), so a prefix alone read the same on every row; the tail tells them apart.
 * @param {string} id
 */
export function idLabel(id) {
  return id.length > 12 ? `${id.slice(0, 4)}…${id.slice(-6)}` : id
}

/** An id as idLabel shows it, the whole one in the title. @param {string | null} id */
export function shortId(id) {
  if (!id) return h('span', { class: 'muted' }, '–')
  return h('code', { title: id }, idLabel(id))
}

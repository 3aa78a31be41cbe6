// @ts-check
/**
 * The console's entry: hash routes to views, the API key form, and the header. A view is a
 * function that fills the main element and returns what stops it (its polling, its chart) when
 * the route changes.
 *
 * Routes: #/topics, #/topics/<topic>, #/groups, #/groups/<group>, #/groups/<group>/deliveries,
 * #/groups/<group>/dead-letters, #/dead-letters, #/schedules.
 */
import { clearKey, getKey, onKeyRequired, setKey } from './api.js'
import { deadLettersIndexView, deadLettersView } from './deadletters.js'
import { deliveriesView } from './deliveries.js'
import { h, replace } from './dom.js'
import { groupView } from './group.js'
import { groupsView } from './groups.js'
import { topicView } from './topic.js'
import { schedulesView } from './schedules.js'
import { topicsView } from './topics.js'

/** @typedef {(root: HTMLElement, params: string[], query: URLSearchParams) => (() => void) | void} View */

/** @type {[RegExp, View, string][]} pattern, view, the nav entry it belongs to */
const ROUTES = [
  [/^\/?$/, topicsView, 'topics'],
  [/^\/topics$/, topicsView, 'topics'],
  [/^\/topics\/([^/]+)$/, topicView, 'topics'],
  [/^\/groups$/, groupsView, 'groups'],
  [/^\/groups\/([^/]+)$/, groupView, 'groups'],
  [/^\/groups\/([^/]+)\/deliveries$/, deliveriesView, 'groups'],
  [/^\/groups\/([^/]+)\/dead-letters$/, deadLettersView, 'dead-letters'],
  [/^\/dead-letters$/, deadLettersIndexView, 'dead-letters'],
  [/^\/schedules$/, schedulesView, 'schedules'],
]

const main = /** @type {HTMLElement} */ (document.getElementById('view'))
const keyForm = /** @type {HTMLFormElement} */ (document.getElementById('key-form'))
const keyInput = /** @type {HTMLInputElement} */ (document.getElementById('key-input'))
const keyMessage = /** @type {HTMLElement} */ (document.getElementById('key-message'))
const forgetKey = /** @type {HTMLButtonElement} */ (document.getElementById('forget-key'))

/** @type {(() => void) | void} */
let stopView

/** Mounts the view the hash names, after stopping the one before. */
function route() {
  if (stopView) stopView()
  stopView = undefined
  const hash = location.hash.replace(/^#/, '')
  const [path = '', search = ''] = hash.split('?', 2)
  const query = new URLSearchParams(search)
  for (const [pattern, view, nav] of ROUTES) {
    const m = pattern.exec(path)
    if (!m) continue
    for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.getAttribute('data-nav') === nav)
    main.replaceChildren()
    let params
    try {
      params = m.slice(1).map((s) => decodeURIComponent(s))
    } catch {
      break // a malformed %-escape: treat as an unknown page
    }
    stopView = view(main, params, query)
    return
  }
  replace(main, h('p', {}, 'No such page. ', h('a', { href: '#/topics' }, 'Go to topics')))
}

/** Shows the key form; the message says whether a key was already tried. */
function askForKey() {
  if (!keyForm.classList.contains('hidden')) return
  keyMessage.textContent = getKey()
    ? 'The broker refused this API key. Enter another one.'
    : 'This broker needs an API key (HOOKQ_API_KEYS). It is kept in this tab only (sessionStorage).'
  keyForm.classList.remove('hidden')
  keyInput.focus()
}

keyForm.addEventListener('submit', (ev) => {
  ev.preventDefault()
  const key = keyInput.value.trim()
  if (key === '') return
  setKey(key)
  keyInput.value = ''
  keyForm.classList.add('hidden')
  forgetKey.classList.remove('hidden')
  route()
})

forgetKey.addEventListener('click', () => {
  clearKey()
  forgetKey.classList.add('hidden')
  route()
})

onKeyRequired(askForKey)
if (getKey()) forgetKey.classList.remove('hidden')
window.addEventListener('hashchange', route)
route()

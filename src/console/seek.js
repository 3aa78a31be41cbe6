// @ts-check
/**
 * The seek form of a group: one partition or all, to an offset or to a time, confirmed before it
 * is sent because it replays or skips messages.
 */
import { api } from './api.js'
import { errorPanel, h, replace } from './dom.js'

/**
 * What the form asks the broker for, or an error message for the user.
 * @param {string} partition '' for all partitions
 * @param {'offset' | 'timestamp'} mode
 * @param {string} value an offset, or a datetime-local value (local time)
 * @returns {{ body: { partition?: number, offset?: number, timestamp?: string } } | { error: string }}
 */
export function seekRequest(partition, mode, value) {
  /** @type {{ partition?: number, offset?: number, timestamp?: string }} */
  const body = {}
  if (partition !== '') body.partition = Number(partition)
  if (mode === 'offset') {
    if (!/^\d+$/.test(value.trim())) return { error: 'The offset must be a whole number, 0 or more.' }
    body.offset = Number(value.trim())
  } else {
    const t = new Date(value)
    if (value === '' || Number.isNaN(t.getTime())) return { error: 'Pick a date and time.' }
    body.timestamp = t.toISOString()
  }
  return { body }
}

/**
 * @param {string} group
 * @param {number} partitions how many partitions the group's topic has
 * @param {() => void} done called after a successful seek
 */
export function seekForm(group, partitions, done) {
  const partition = h(
    'select',
    { name: 'partition' },
    h('option', { value: '' }, 'all partitions'),
    Array.from({ length: partitions }, (_, p) => h('option', { value: String(p) }, `partition ${p}`)),
  )
  const mode = h('select', { name: 'mode' }, h('option', { value: 'offset' }, 'to offset'), h('option', { value: 'timestamp' }, 'to time'))
  const offset = h('input', { name: 'offset', type: 'number', min: 0, step: 1, placeholder: 'offset', required: true })
  const time = h('input', { name: 'timestamp', type: 'datetime-local', step: 1, class: 'hidden' })
  const result = h('div', { class: 'seek-result', role: 'status' })
  mode.addEventListener('change', () => {
    offset.classList.toggle('hidden', mode.value !== 'offset')
    offset.required = mode.value === 'offset'
    time.classList.toggle('hidden', mode.value !== 'timestamp')
  })

  const form = h(
    'form',
    { class: 'inline-form seek' },
    'Move the committed offset of ',
    partition,
    ' ',
    mode,
    ' ',
    offset,
    time,
    ' ',
    h('button', { type: 'submit' }, 'Seek…'),
    result,
  )
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault()
    const chosen = mode.value === 'timestamp' ? 'timestamp' : 'offset'
    const req = seekRequest(partition.value, chosen, chosen === 'offset' ? offset.value : time.value)
    if ('error' in req) {
      replace(result, h('span', { class: 'error-text' }, req.error))
      return
    }
    const where = req.body.partition === undefined ? 'every partition' : `partition ${req.body.partition}`
    const to = req.body.offset !== undefined ? `offset ${req.body.offset}` : `the first offset at or after ${req.body.timestamp}`
    // Moving back redelivers, moving forward skips: worth a second look.
    if (!window.confirm(`Move ${where} of group ${group} to ${to}?\n\nEarlier offsets are redelivered; skipped ones are never pushed.`))
      return
    try {
      const answer = await api.seek(group, req.body)
      replace(
        result,
        h(
          'span',
          { class: 'ok-text' },
          `Committed offsets now: ${answer.partitions.map((p) => `p${p.partition} ${p.committedOffset}`).join(' · ')}`,
        ),
      )
      done()
    } catch (err) {
      replace(result, errorPanel(err))
    }
  })
  return form
}

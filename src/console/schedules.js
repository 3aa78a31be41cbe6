// @ts-check
/**
 * Schedules: every schedule with its timing, its next run and its last tick, polled; a button
 * pauses or resumes one (a PUT of the schedule as it is, with `paused` flipped).
 */
import { api } from './api.js'
import { badge, errorPanel, fmtDuration, fmtTime, h, hashLink, replace, table } from './dom.js'
import { poll } from './samples.js'

/**
 * A schedule's timing as text: `cron 0 9 * * 1-5 (Europe/Berlin)` or `every 1m`.
 * @param {import('./api.js').Schedule} s
 */
export function timingText(s) {
  return s.cron !== undefined ? `cron ${s.cron} (${s.timeZone})` : `every ${fmtDuration(s.every ?? 0)}`
}

/**
 * The body that puts `s` back as it is but for `paused`.
 * @param {import('./api.js').Schedule} s @param {boolean} paused
 * @returns {import('./api.js').ScheduleConfig}
 */
export function withPaused(s, paused) {
  return {
    topic: s.topic,
    ...(s.cron !== undefined ? { cron: s.cron } : { every: s.every }),
    timeZone: s.timeZone,
    message: s.message,
    missed: s.missed,
    paused,
  }
}

/** @type {import('./app.js').View} */
export function schedulesView(root) {
  const problem = h('div')
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'))
  replace(root, h('h1', {}, 'Schedules'), problem, body)

  /** @param {import('./api.js').Schedule} s */
  const toggle = async (s) => {
    try {
      await api.putSchedule(s.name, withPaused(s, !s.paused))
      replace(problem)
      await refresh()
    } catch (err) {
      replace(problem, errorPanel(err))
    }
  }

  const refresh = async () => {
    try {
      const schedules = await api.schedules()
      const rows = schedules.map((s) =>
        h(
          'tr',
          { 'data-schedule': s.name },
          h('td', {}, s.name),
          h('td', {}, h('a', { href: hashLink('topics', s.topic) }, s.topic)),
          h('td', { class: 'timing' }, timingText(s)),
          h('td', { class: 'next-run' }, s.paused ? badge('paused', 'warn') : s.nextRuns[0] ? fmtTime(s.nextRuns[0]) : '–'),
          h('td', { class: 'last-tick' }, s.lastTickAt ? fmtTime(s.lastTickAt) : '–'),
          h('td', {}, s.missed),
          h('td', {}, h('button', { type: 'button', class: 'pause', onclick: () => toggle(s) }, s.paused ? 'Resume' : 'Pause')),
        ),
      )
      replace(
        body,
        table(
          ['Schedule', 'Topic', 'Timing', 'Next run', 'Last tick', 'Missed', ''],
          rows,
          'No schedules yet: create one with PUT /v1/schedules/{name}.',
          { class: 'schedules' },
        ),
      )
    } catch (err) {
      replace(body, errorPanel(err))
    }
  }
  return poll(refresh)
}

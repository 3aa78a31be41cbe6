// @ts-check
/**
 * The lag and throughput chart of a group (uPlot): total lag on the left axis, messages a second
 * produced and completed on the right one, over the samples the group view has polled.
 */
import uPlot from './vendor/uPlot.esm.js'
import { COUNT_STEPS, fmtInt, fmtTime, h, timeTickLabels } from './dom.js'

const HEIGHT_PX = 240

/**
 * A y axis's width for its widest tick label. uPlot's default is a fixed 50 px, into which
 * "12,000" does not fit, so the labels ran under the axis title. As in uPlot's axis-autosize demo.
 * @param {uPlot} u @param {string[] | null} values @param {number} axisIdx @param {number} cycleNum
 */
function fitTickLabels(u, values, axisIdx, cycleNum) {
  const axis = /** @type {uPlot.Axis & { _size?: number }} */ (u.axes[axisIdx])
  // uPlot calls this again while it settles the layout; keep the size found in the first round.
  if (cycleNum > 1 && axis._size !== undefined) return axis._size
  let size = (axis.ticks?.size ?? 10) + (axis.gap ?? 5)
  const widest = (values ?? []).reduce((a, v) => (v.length > a.length ? v : a), '')
  if (widest !== '') {
    // At run time uPlot keeps the axis font as [css font, size px] (the option's string, scaled).
    const font = /** @type {unknown} */ (axis.font)
    if (Array.isArray(font)) u.ctx.font = font[0]
    size += u.ctx.measureText(widest).width / devicePixelRatio
  }
  return Math.ceil(size) + 4
}

/**
 * Mounts an empty chart in `container`; `update` redraws it from a history's columns.
 * @param {HTMLElement} container
 */
export function lagChart(container) {
  const host = h('div', { class: 'chart', 'aria-label': 'Lag and throughput over the last 10 minutes', role: 'img' })
  container.appendChild(host)
  // The host is a block inside the container's padding: its width is the width there is to draw in.
  const width = () => Math.max(320, host.clientWidth)
  /** @type {import('uplot').Options} */
  const opts = {
    width: width(),
    height: HEIGHT_PX,
    cursor: { drag: { x: false, y: false } },
    scales: {
      x: { time: true },
      lag: { range: (_u, _min, max) => [0, Math.max(1, max)] },
      rate: { range: (_u, _min, max) => [0, Math.max(1, max)] },
    },
    series: [
      { value: (_u, v) => (v === null ? '–' : fmtTime(new Date(v * 1000).toISOString())) },
      {
        label: 'Lag',
        scale: 'lag',
        stroke: '#c2410c',
        width: 2,
        fill: 'rgba(194, 65, 12, 0.08)',
        value: (_u, v) => (v === null ? '–' : String(v)),
      },
      { label: 'Produced msg/s', scale: 'rate', stroke: '#2563eb', width: 1.5, value: (_u, v) => (v === null ? '–' : v.toFixed(1)) },
      { label: 'Completed msg/s', scale: 'rate', stroke: '#15803d', width: 1.5, value: (_u, v) => (v === null ? '–' : v.toFixed(1)) },
    ],
    axes: [
      { stroke: '#555', values: (_u, splits, _axis, _space, stepSeconds) => timeTickLabels(splits, stepSeconds) },
      {
        scale: 'lag',
        label: 'lag (messages)',
        stroke: '#c2410c',
        size: fitTickLabels,
        incrs: COUNT_STEPS,
        values: (_u, splits) => splits.map((v) => fmtInt(v)),
      },
      { scale: 'rate', label: 'msg/s', side: 1, stroke: '#2563eb', grid: { show: false }, size: fitTickLabels },
    ],
  }
  const plot = new uPlot(opts, [[], [], [], []], host)
  // Follows the page width; uPlot draws on a canvas of fixed size.
  const resize = new ResizeObserver(() => plot.setSize({ width: width(), height: HEIGHT_PX }))
  resize.observe(host)
  return {
    /** @param {import('uplot').AlignedData} data */
    update: (data) => plot.setData(data),
    destroy: () => {
      resize.disconnect()
      plot.destroy()
    },
  }
}

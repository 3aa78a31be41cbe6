/** The rows of bench/peers.ts: one per system and round, their medians, and the printed tables. */

export interface RoundResult {
  system: string
  label: string
  round: number
  /** Unique messages the sink received (bare POSTs answered 2xx for the ceiling). */
  messages: number
  seconds: number
  perS: number
  /** CPU per message, µs: the worker process (hookq: the broker; ceiling: the load process), the server, the producer. */
  workerUs: number
  serverUs: number
  producerUs: number
  /** Busy CPU of the host not counted to any process of the bench or to either server, % of one core. */
  otherPct: number
  duplicates: number
  p50: number
  p99: number
  /** Something went wrong (timed out, failed pushes): said beside the figures. */
  notes: string
}

export const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '-')
export const fixed = (n: number, digits = 1) => (Number.isFinite(n) ? n.toFixed(digits) : '-')
const ratio = (n: number) => (Number.isFinite(n) ? `${n.toFixed(2)}x` : '-')

/** Median of the finite values; NaN if none. */
export function median(values: number[]): number {
  const v = values.filter(Number.isFinite).sort((a, b) => a - b)
  if (v.length === 0) return NaN
  const mid = v.length >> 1
  return v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
}

function render(head: string[], body: string[][], leftColumns = 1): string {
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i]!.length)))
  const line = (cells: string[]) => cells.map((c, i) => (i < leftColumns ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n')
}

/** One round of one system, as it finishes. */
export function roundLine(r: RoundResult): string {
  return (
    `round ${r.round} ${r.system}: ${int(r.perS)} msg/s (${int(r.messages)} in ${fixed(r.seconds, 2)} s); CPU per message: ` +
    `worker ${fixed(r.workerUs, 0)} us, server ${fixed(r.serverUs, 0)} us, producer ${fixed(r.producerUs, 0)} us; ` +
    `p50/p99 ${fixed(r.p50, 1)}/${fixed(r.p99, 1)} ms; duplicates ${r.duplicates}; other CPU ${fixed(r.otherPct, 0)}%` +
    (r.notes ? `\n  ${r.notes}` : '')
  )
}

/** Every round's figures, one line each. */
export function roundsTable(rows: RoundResult[]): string {
  const head = [
    'round',
    'system',
    'msg/s',
    'seconds',
    'worker us',
    'server us',
    'total us',
    'producer us',
    'p50 ms',
    'p99 ms',
    'dups',
    'other CPU%',
  ]
  const body = rows.map((r) => [
    String(r.round),
    r.system,
    int(r.perS),
    fixed(r.seconds, 2),
    fixed(r.workerUs, 0),
    fixed(r.serverUs, 0),
    fixed(r.workerUs + r.serverUs, 0),
    fixed(r.producerUs, 0),
    fixed(r.p50, 1),
    fixed(r.p99, 1),
    int(r.duplicates),
    fixed(r.otherPct, 0),
  ])
  return render(head, body, 2)
}

/**
 * The medians per system over the rounds (each column its own median; total = the median of the
 * rounds' totals), with the ratios to hookq's medians.
 */
export function mediansTable(rows: RoundResult[], systems: { system: string; label: string }[]): string {
  const med = (s: string, f: (r: RoundResult) => number) => median(rows.filter((r) => r.system === s).map(f))
  const hookqPerS = med('hookq', (r) => r.perS)
  const hookqTotal = med('hookq', (r) => r.workerUs + r.serverUs)
  const head = [
    'system',
    'msg/s',
    'msg/s, ratio to hookq',
    'CPU us/msg: worker or broker',
    'server',
    'total',
    'total, ratio to hookq',
    'producer us/msg',
    'p99 ms',
    'dups',
    'other CPU% (max)',
  ]
  const body = systems
    .filter(({ system }) => rows.some((r) => r.system === system))
    .map(({ system, label }) => {
      const ceiling = system === 'ceiling'
      const total = med(system, (r) => r.workerUs + r.serverUs)
      const others = rows.filter((r) => r.system === system).map((r) => r.otherPct)
      return [
        label,
        int(med(system, (r) => r.perS)),
        ratio(med(system, (r) => r.perS) / hookqPerS),
        fixed(
          med(system, (r) => r.workerUs),
          0,
        ),
        ceiling
          ? ''
          : fixed(
              med(system, (r) => r.serverUs),
              0,
            ),
        ceiling ? '' : fixed(total, 0),
        ceiling ? '' : ratio(total / hookqTotal),
        ceiling
          ? ''
          : fixed(
              med(system, (r) => r.producerUs),
              0,
            ),
        fixed(
          med(system, (r) => r.p99),
          1,
        ),
        int(rows.filter((r) => r.system === system).reduce((n, r) => n + r.duplicates, 0)),
        `${fixed(median(others), 0)} (${fixed(Math.max(...others), 0)})`,
      ]
    })
  return render(head, body)
}

/**
 * BENCH_LATENCY_TRACE=<dir>: the latency scenarios' load and receiver write what they saw, a line
 * per message or call, as CSV files in that folder (see bench/e2e-receiver.ts).
 */
import { mkdirSync, writeFileSync } from 'node:fs'

/** The folder of the traces; undefined when none are asked for. */
export const TRACE_DIR = process.env.BENCH_LATENCY_TRACE || undefined

/** Writes <TRACE_DIR>/<name>.csv: the header line, then the lines. */
export function writeTrace(name: string, header: string, lines: string[]): void {
  if (TRACE_DIR === undefined) return
  mkdirSync(TRACE_DIR, { recursive: true })
  writeFileSync(`${TRACE_DIR}/${name}.csv`, `${header}\n${lines.join('\n')}\n`)
}

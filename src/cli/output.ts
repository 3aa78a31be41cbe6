/**
 * What the CLI prints and how it ends: tables for people, JSON for scripts (`--json`), progress
 * bars on a terminal's stderr only, and one mapping from failures to exit codes:
 *
 *   0 success · 1 the broker answered an error · 2 usage error · 3 the broker could not be reached
 *
 * Expected failures print one clear message to stderr, never a stack trace.
 */
import Table from 'cli-table3'
import cliProgress from 'cli-progress'
import { HookqError } from '@hookq/client'

/** The process exit codes of the CLI. */
export const EXIT = { ok: 0, broker: 1, usage: 2, unreachable: 3 } as const

/** A failure the CLI explains itself; `exitCode` is one of EXIT. */
export class CliError extends Error {
  override name = 'CliError'
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message)
  }
}

/** The command line asks for something impossible (exit 2). */
export class UsageError extends CliError {
  constructor(message: string) {
    super(message, EXIT.usage)
  }
}

/**
 * No answer from the broker: connection refused, name unknown, a broken connection or a timeout
 * (exit 3). `mayHaveReachedBroker` is false only when the call surely never left (refused, unknown
 * name): after a reset or a timeout the broker may have read the call and acted on it.
 */
export class UnreachableError extends CliError {
  constructor(
    readonly url: string,
    reason: string,
    readonly mayHaveReachedBroker = false,
  ) {
    super(`cannot reach the broker at ${url}: ${reason}`, EXIT.unreachable)
  }
}

/** An error with lines that explain it (e.g. how much of a bulk operation was done before it). */
export class ExplainedError extends Error {
  override name = 'ExplainedError'
  constructor(
    readonly error: unknown,
    readonly notes: string[],
  ) {
    super(error instanceof Error ? error.message : String(error))
  }
}

/** Writes `value` as JSON on stdout (indented: one document, for jq and people alike). */
export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`)
}

/** `n` and the noun, singular for 1: `count(1, 'partition')` is "1 partition", `count(3, 'dead letter')` "3 dead letters". */
export function count(n: number, noun: string): string {
  return `${n} ${n === 1 ? noun : `${noun}s`}`
}

/** Writes one line on stdout. */
export function printLine(text: string): void {
  process.stdout.write(`${text}\n`)
}

/** Says on stderr that a call is waited out (429/503 Retry-After): the `onRetry` of every retried call. */
export function noteRetry(err: { code?: string; status: number }, waitMs: number, attempt: number): void {
  note(`hookq: the broker is busy (${err.code ?? err.status}); retry ${attempt} in ${Math.ceil(waitMs / 1000)} s`)
}

/** Writes one line on stderr: notes and summaries that must not mix with the data on stdout. */
export function note(text: string): void {
  process.stderr.write(`${text}\n`)
}

type Cell = string | number | boolean | null | undefined

/**
 * A table without borders or colours, like `kubectl get`: columns two spaces apart, easy to read
 * and to cut with awk. Nulls and undefined print as `-`.
 */
export function printTable(head: string[], rows: Cell[][]): void {
  const blank = {
    top: '',
    'top-mid': '',
    'top-left': '',
    'top-right': '',
    bottom: '',
    'bottom-mid': '',
    'bottom-left': '',
    'bottom-right': '',
    left: '',
    'left-mid': '',
    mid: '',
    'mid-mid': '',
    right: '',
    'right-mid': '',
    middle: '  ',
  }
  const table = new Table({
    head: head.map((h) => h.toUpperCase()),
    chars: blank,
    style: { head: [], border: [], 'padding-left': 0, 'padding-right': 0 },
  })
  for (const row of rows) table.push(row.map((c) => (c === null || c === undefined ? '-' : visible(String(c)))))
  const text = rows.length === 0 ? head.map((h) => h.toUpperCase()).join('  ') : table.toString()
  process.stdout.write(
    `${text
      .split('\n')
      .map((l) => l.trimEnd())
      .join('\n')}\n`,
  )
}

/** A progress bar on stderr, or nothing when stderr is not a terminal or progress is off. */
export interface Progress {
  update(value: number, total?: number): void
  stop(): void
}

/**
 * Starts a progress bar labelled `label` for `total` items when `enabled` and stderr is a terminal;
 * with `total` undefined (a pipe of unknown length) it counts `unit` instead of drawing a bar.
 */
export function startProgress(label: string, total: number | undefined, enabled: boolean, unit = 'messages'): Progress {
  if (!enabled || process.stderr.isTTY !== true) return { update: () => {}, stop: () => {} }
  const format =
    total === undefined
      ? `${label} {value} ${unit} | {duration_formatted}`
      : `${label} [{bar}] {percentage}% | {value}/{total} ${unit} | ETA {eta_formatted}`
  const bar = new cliProgress.SingleBar(
    { format, stream: process.stderr, hideCursor: true, etaBuffer: 50 },
    cliProgress.Presets.shades_classic,
  )
  bar.start(total ?? 0, 0)
  return {
    update: (value, newTotal) => {
      if (newTotal !== undefined) bar.setTotal(newTotal)
      bar.update(value)
    },
    stop: () => bar.stop(),
  }
}

/**
 * Prints what went wrong on stderr and returns the exit code. Broker errors print their problem
 * code and detail (the whole problem document with `--json`); anything unexpected prints its
 * message and, only with HOOKQ_DEBUG set, its stack.
 */
export function reportError(err: unknown, json: boolean): number {
  if (err instanceof ExplainedError) {
    const code = reportError(err.error, json)
    for (const line of err.notes) note(json ? JSON.stringify({ note: line }) : `hookq: ${line}`)
    return code
  }
  if (err instanceof HookqError) {
    if (json) {
      note(JSON.stringify({ error: { status: err.status, ...err.problem } }))
      return EXIT.broker
    }
    const detail = err.problem.detail ?? err.problem.title ?? 'request failed'
    // A detail can quote the caller's input back (a URL, a name): shown escaped like table cells.
    note(`hookq: ${err.code ?? 'error'} (HTTP ${err.status}): ${visible(detail)}`)
    // The detail often is the errors already, joined: list only what it does not say.
    for (const e of err.problem.errors ?? []) {
      if (!detail.includes(e.message)) note(`  ${visible(e.path || '(body)')}: ${visible(e.message)}`)
    }
    if (err.status === 401) note('  set HOOKQ_API_KEY or pass --api-key <key>')
    if (err.status === 403) note("  the API key's scopes do not cover this call (its action, or this topic or group): see the detail above")
    return EXIT.broker
  }
  if (err instanceof CliError) {
    note(json ? JSON.stringify({ error: { code: codeOf(err.exitCode), detail: err.message } }) : `hookq: ${err.message}`)
    return err.exitCode
  }
  const message = err instanceof Error ? err.message : String(err)
  note(`hookq: unexpected error: ${message}`)
  if (process.env.HOOKQ_DEBUG && err instanceof Error && err.stack) note(err.stack)
  return EXIT.broker
}

function codeOf(exitCode: number): string {
  return exitCode === EXIT.usage ? 'usage' : exitCode === EXIT.unreachable ? 'unreachable' : 'error'
}

// C0 and C1 controls, DEL, and the bidirectional controls that reorder what a terminal shows: the
// marks (U+061C, U+200E, U+200F), overrides and embeddings (U+202A–U+202E), isolates (U+2066–U+2069).
// biome-ignore lint/suspicious/noControlCharactersInRegex: these are the characters it escapes
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g
// What JSON.stringify leaves raw of those: it escapes C0 itself.
const UNSAFE_IN_JSON = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g
const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' }

/**
 * Text from the broker (a consumer's error answer, a disabled reason) as a terminal must show it:
 * control characters escaped (`\x1b`, `\n`, `\u202e`), so an answer cannot move the cursor, retitle
 * the window or hide text. A backslash is doubled only when the text has something escaped, so
 * plain text is shown unchanged.
 */
export function visible(text: string): string {
  if (!new RegExp(UNSAFE.source).test(text)) return text
  return text
    .replace(/\\/g, '\\\\')
    .replace(
      UNSAFE,
      (ch) =>
        NAMED[ch] ??
        (ch.charCodeAt(0) <= 0xff
          ? `\\x${ch.charCodeAt(0).toString(16).padStart(2, '0')}`
          : `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`),
    )
}

/**
 * JSON text (JSON.stringify's) as a terminal must show it: DEL, C1 and bidirectional controls as
 * `\u` escapes. Still JSON, and it parses to the same value: outside strings JSON has none of them.
 */
export function visibleJson(json: string): string {
  if (!new RegExp(UNSAFE_IN_JSON.source).test(json)) return json
  return json.replace(UNSAFE_IN_JSON, (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`)
}

/** Keeps a cell short: the first line, cut at `max` characters. */
export function short(text: string | null | undefined, max = 60): string | undefined {
  if (text === null || text === undefined) return undefined
  const line = text.split('\n')[0] ?? ''
  return line.length > max ? `${line.slice(0, max - 1)}…` : line
}

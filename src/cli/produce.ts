/**
 * `hookq produce <topic> [values...]`: messages from the arguments, or from stdin as NDJSON (one
 * JSON value a line; blank lines are skipped).
 *
 * Arguments are all parsed before anything is sent, so a bad one sends nothing. Stdin is streamed
 * in calls of up to 1000 messages (the contract's limit) as it is read: an input of one call or
 * less is still all or nothing, and a longer one that hits a bad line or a broker error stops
 * there and says how many messages were committed and up to which line. A call whose outcome is
 * unknown (its connection broke or timed out after it was sent, or the broker answered 500
 * `outcome_unknown`) is reported as such, with its lines: the broker may have stored them. With
 * `--idempotency-prefix` every message carries the key `<prefix>:<line>`, so the same input can be
 * sent again after a failure without storing anything twice.
 */
import { createInterface } from 'node:readline'
import type { Command } from 'commander'
import { BatchProduceError, HookqError, produceInBatches, type ProduceMessage, type ProduceResult } from '@hookq/client'
import { headerPair, partitionNumber, wholeNumber } from './args.ts'
import { contextOf, type CliContext } from './context.ts'
import {
  count,
  ExplainedError,
  noteRetry,
  printJson,
  printLine,
  printTable,
  startProgress,
  UnreachableError,
  UsageError,
  type Progress,
} from './output.ts'

interface ProduceOptions {
  key?: string
  header?: Record<string, string>
  partition?: number
  delayMs?: number
  idempotencyPrefix?: string
  text?: boolean
  batchSize: number
}

/** One message of the input and where it came from: its line or argument number, from 1. */
interface Item {
  message: ProduceMessage
  position: number
}

type Where = 'line' | 'argument'

// Results are listed one a row up to this many; past it, one row a partition.
const MAX_LISTED = 20

/** Adds `produce` to `program`. */
export function registerProduce(program: Command): void {
  program
    .command('produce <topic> [values...]')
    .description('produce messages: JSON values as arguments, or NDJSON on stdin (one value a line)')
    .option('-k, --key <key>', 'the key of every message (messages with one key go to one partition)')
    .option('-H, --header <name=value>', 'a header of every message (repeatable)', headerPair)
    .option('-p, --partition <n>', 'the partition of every message', partitionNumber)
    .option('--delay-ms <ms>', 'push each message no earlier than this long after produce', wholeNumber(0, 2_147_483_647))
    .option('--idempotency-prefix <prefix>', 'give each message the idempotency key <prefix>:<line or argument number>')
    .option('--text', 'send each argument or line as a JSON string instead of parsing it')
    .option('--batch-size <n>', 'messages a call, 1 to 1000', wholeNumber(1, 1000), 1000)
    .action(async (topic: string, values: string[], opts: ProduceOptions, cmd: Command) => {
      const ctx = contextOf(cmd)
      const results = values.length > 0 ? await fromArguments(ctx, topic, values, opts) : await fromStdin(ctx, topic, opts)
      report(ctx, topic, results)
    })
}

async function fromArguments(ctx: CliContext, topic: string, values: string[], opts: ProduceOptions): Promise<ProduceResult[]> {
  const items = values.map((v, i) => itemOf(v, i + 1, 'argument', opts))
  const sender = new Sender(ctx, topic, opts, 'argument', values.length)
  try {
    await sender.send(items)
  } catch (err) {
    throw sender.explain(err)
  }
  return sender.results
}

async function fromStdin(ctx: CliContext, topic: string, opts: ProduceOptions): Promise<ProduceResult[]> {
  if (process.stdin.isTTY === true) {
    throw new UsageError('nothing to produce: give JSON values as arguments, or pipe NDJSON (one JSON value a line) on stdin')
  }
  const sender = new Sender(ctx, topic, opts, 'line')
  let pending: Item[] = []
  let line = 0
  try {
    for await (const text of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      line++
      if (text.trim() === '') continue
      pending.push(itemOf(text, line, 'line', opts))
      if (pending.length >= opts.batchSize) {
        // Only inputs longer than one call get a bar: a shorter one is done before a bar would show.
        sender.showProgress()
        await sender.send(pending)
        pending = []
      }
    }
    if (pending.length > 0) await sender.send(pending)
  } catch (err) {
    throw sender.explain(err)
  } finally {
    sender.progress.stop()
  }
  if (sender.results.length === 0) throw new UsageError('nothing to produce: stdin had no JSON values')
  return sender.results
}

function itemOf(text: string, position: number, where: Where, opts: ProduceOptions): Item {
  let value: unknown = text
  if (opts.text !== true) {
    try {
      value = JSON.parse(text)
    } catch (err) {
      throw new UsageError(
        `${where} ${position} is not valid JSON (${(err as Error).message}); write strings as JSON ('"text"') or pass --text`,
      )
    }
  }
  const message: ProduceMessage = { value }
  if (opts.key !== undefined) message.key = opts.key
  if (opts.header !== undefined) message.headers = opts.header
  if (opts.partition !== undefined) message.partition = opts.partition
  if (opts.delayMs !== undefined) message.delayMs = opts.delayMs
  if (opts.idempotencyPrefix !== undefined) message.idempotencyKey = `${opts.idempotencyPrefix}:${position}`
  return { message, position }
}

/** Sends items in order and remembers how far it got, to explain a failure. */
class Sender {
  readonly results: ProduceResult[] = []
  progress: Progress = { update: () => {}, stop: () => {} }
  /** Line or argument number of the last committed message. */
  private lastCommitted = 0
  /** The lines or arguments of a failed call that may have been stored all the same. */
  private inDoubt: { first: number; last: number } | undefined
  private started = false

  /** `lastPosition`: the number of the input's last argument, when known (stdin: not before its end). */
  constructor(
    private readonly ctx: CliContext,
    private readonly topic: string,
    private readonly opts: ProduceOptions,
    private readonly where: Where,
    private readonly lastPosition?: number,
  ) {}

  showProgress(): void {
    if (this.started) return
    this.started = true
    this.progress = startProgress(`produce ${this.topic}`, undefined, this.ctx.progress)
  }

  async send(items: Item[]): Promise<void> {
    let done = 0 // items of this call committed so far (always a prefix)
    try {
      await produceInBatches(
        this.ctx.client,
        this.topic,
        items.map((i) => i.message),
        {
          maxBatchMessages: this.opts.batchSize,
          onRetry: noteRetry,
          onCommitted: (results) => {
            this.results.push(...results)
            done += results.length
            this.lastCommitted = items[done - 1]?.position ?? this.lastCommitted
            this.progress.update(this.results.length)
          },
        },
      )
    } catch (err) {
      if (!(err instanceof BatchProduceError)) throw err
      if (mayHaveBeenStored(err.cause)) {
        const first = items[err.committed]
        const last = items[Math.min(items.length, err.committed + Math.max(1, err.attempted)) - 1]
        if (first !== undefined && last !== undefined) this.inDoubt = { first: first.position, last: last.position }
      }
      const failed = err.failedIndex === undefined ? undefined : items[err.failedIndex]
      throw new ExplainedError(err.cause, failed === undefined ? [] : [`the broker refused ${this.where} ${failed.position}`])
    }
  }

  /** The error, with how much of the input was committed before it (and what may have been). */
  explain(err: unknown): unknown {
    const notes = this.inDoubt === undefined ? [this.committedNote()] : this.inDoubtNotes(this.inDoubt)
    if (err instanceof ExplainedError) return new ExplainedError(err.error, [...err.notes, ...notes])
    if (err instanceof UsageError && this.results.length > 0) return new UsageError(`${err.message}; ${notes.join('; ')}`)
    return err instanceof UsageError ? err : new ExplainedError(err, notes)
  }

  private committedNote(): string {
    return this.results.length === 0
      ? 'nothing was committed'
      : `${committed(this.results.length)} (${this.where}s 1 to ${this.lastCommitted}); nothing after ${this.where} ${this.lastCommitted} was sent`
  }

  /**
   * The broker may have stored the failed call (its answer was lost, or it could not tell): saying
   * "nothing was committed" would make a re-run store those messages twice.
   */
  private inDoubtNotes({ first, last }: { first: number; last: number }): string[] {
    const one = first === last
    const range = one ? `${this.where} ${first}` : `${this.where}s ${first} to ${last}`
    const before = this.results.length === 0 ? '' : `${committed(this.results.length)} (${this.where}s 1 to ${this.lastCommitted}); `
    const after = last === this.lastPosition ? '' : `; nothing after ${this.where} ${last} was sent`
    const sent = `${before}${range} ${one ? 'was' : 'were'} sent, but whether the broker stored ${one ? 'it' : 'them'} is unknown${after}`
    const prefix = this.opts.idempotencyPrefix
    const rerun =
      prefix !== undefined
        ? `running the same input again with --idempotency-prefix ${shellWord(prefix)} is safe: messages already stored are not stored twice`
        : `these messages had no idempotency key: running the same input again may store ${range} twice, so check what is stored first (hookq tail ${shellWord(this.topic)}); a run with --idempotency-prefix can always be repeated safely`
    return [sent, rerun]
  }
}

/**
 * Whether a failed produce call may have been stored anyway. Only answers known to come before the
 * commit or to exclude it say no: a 4xx (invalid, too large, unknown topic, 429) or a 503 (load
 * shed), and a connection that was never made. A lost connection or a timeout after the call left,
 * a 500 `outcome_unknown` and any other 5xx may follow a commit.
 */
function mayHaveBeenStored(cause: unknown): boolean {
  if (cause instanceof UnreachableError) return cause.mayHaveReachedBroker
  if (cause instanceof HookqError) return !((cause.status >= 400 && cause.status < 500) || cause.status === 503)
  return true
}

/** "1 message was committed", "2 messages were committed". */
function committed(n: number): string {
  return `${count(n, 'message')} ${n === 1 ? 'was' : 'were'} committed`
}

/** `text` as one shell word, quoted only when it must be. */
function shellWord(text: string): string {
  return /^[\w.:@%+=,/-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`
}

function report(ctx: CliContext, topic: string, results: ProduceResult[]): void {
  const duplicates = results.filter((r) => r.duplicate === true).length
  if (ctx.json) return printJson({ topic, produced: results.length - duplicates, duplicates, results })
  printLine(
    `produced ${count(results.length - duplicates, 'message')} to ${topic}${duplicates > 0 ? ` (${duplicates} ${duplicates === 1 ? 'was a duplicate' : 'were duplicates'}, stored before)` : ''}`,
  )
  if (results.length <= MAX_LISTED) {
    printTable(
      ['partition', 'offset', 'duplicate'],
      results.map((r) => [r.partition, r.offset, r.duplicate === true ? 'yes' : '']),
    )
    return
  }
  const byPartition = new Map<number, { count: number; first: number; last: number }>()
  for (const r of results) {
    const p = byPartition.get(r.partition)
    if (p === undefined) byPartition.set(r.partition, { count: 1, first: r.offset, last: r.offset })
    else {
      p.count++
      p.first = Math.min(p.first, r.offset)
      p.last = Math.max(p.last, r.offset)
    }
  }
  printTable(
    ['partition', 'messages', 'offsets'],
    [...byPartition].sort((a, b) => a[0] - b[0]).map(([p, s]) => [p, s.count, `${s.first}-${s.last}`]),
  )
}

/**
 * `hookq tail <topic>`: print a topic's messages, one line each (NDJSON with --json), from an
 * offset or the last few; with --follow, keep polling for new ones until Ctrl-C (which exits 0).
 * Without --follow it reads only what it prints, a page at a time, up to the end offsets seen at
 * the start: `--limit n` stops after n (from --from or --last), or alone prints the newest n.
 * Polling backs off from 100 ms to --max-poll-ms while nothing arrives and snaps back when
 * something does, so an idle tail costs a request every couple of seconds. A follow outlives a
 * broker restart: it says so on stderr, retries with backoff, and goes on from where it was.
 */
import type { Command } from 'commander'
import { HookqError, unwrap, withRetries, type HookqClient, type Message } from '@hookq/client'
import { partitionNumber, wholeNumber } from './args.ts'
import { contextOf, type CliContext } from './context.ts'
import { count, note, noteRetry, printLine, UnreachableError, UsageError, visible, visibleJson } from './output.ts'
import { timerDelayMs } from '../core/timer-delay.ts'

interface TailOptions {
  partition?: number
  from?: string
  last?: number
  follow?: boolean
  limit?: number
  maxPollMs: number
}

// Without --follow, --from, --last and --limit, a tail shows this many messages a partition, like tail(1).
const DEFAULT_LAST = 10
const MIN_POLL_MS = 100
const PAGE = 1000
// While following, a broker that cannot be reached is tried again after 250 ms, doubling to 5 s.
const RECONNECT_MIN_MS = 250
const RECONNECT_MAX_MS = 5000

/** Adds `tail` to `program`. */
export function registerTail(program: Command): void {
  program
    .command('tail <topic>')
    .description('print messages of a topic (every partition, or one), and with --follow keep printing new ones')
    .option('-p, --partition <n>', 'only this partition', partitionNumber)
    .option('--from <offset>', 'first offset of each partition: a number, "beginning" or "end" (default end with --follow)')
    .option(
      '-n, --last <n>',
      `start this many messages before the end of each partition (default ${DEFAULT_LAST} without --follow or --limit)`,
      wholeNumber(0),
    )
    .option('-f, --follow', 'keep polling for new messages until Ctrl-C')
    .option('--limit <n>', 'stop after this many messages (without --from, --last or --follow: print the newest n)', wholeNumber(1))
    .option('--max-poll-ms <ms>', 'longest wait between polls while idle', wholeNumber(MIN_POLL_MS, 60_000), 2000)
    .action(async (topic: string, opts: TailOptions, cmd: Command) => {
      if (opts.from !== undefined && opts.last !== undefined) throw new UsageError('give --from or --last, not both')
      const stop = new AbortController()
      const onSignal = () => stop.abort()
      process.once('SIGINT', onSignal)
      process.once('SIGTERM', onSignal)
      try {
        await tail(contextOf(cmd, stop.signal), topic, opts)
      } catch (err) {
        if (!stop.signal.aborted) throw err // Ctrl-C mid-call is the normal end of a follow
      } finally {
        process.off('SIGINT', onSignal)
        process.off('SIGTERM', onSignal)
      }
    })
}

async function tail(ctx: CliContext, topic: string, opts: TailOptions): Promise<void> {
  const signal = ctx.signal!
  const retry = { signal, onRetry: noteRetry }
  const detail = await withRetries(() => unwrap(ctx.client.GET('/v1/topics/{topic}', { params: { path: { topic } }, signal })), retry)
  if (opts.partition !== undefined && opts.partition >= detail.partitions) {
    throw new UsageError(
      `topic ${topic} has ${count(detail.partitions, 'partition')} (0 to ${detail.partitions - 1}); there is no partition ${opts.partition}`,
    )
  }
  const stats = detail.partitionStats.filter((s) => opts.partition === undefined || s.partition === opts.partition)
  const read: Reader = (partition, fromOffset, limit) =>
    withRetries(() => fetchPage(ctx.client, topic, partition, fromOffset, limit, signal), retry)
  const print = (m: Message) => printLine(printable(m, ctx.json === true))

  if (opts.follow !== true) {
    // Up to the end offsets seen at the start: a plain tail ends even while producers keep going.
    if (opts.limit !== undefined && opts.from === undefined && opts.last === undefined) {
      await printNewest(stats, opts.limit, read, print)
    } else {
      await printMerged(
        stats.map((s) => ({ partition: s.partition, next: startOf(opts, s.endOffset), end: s.endOffset })),
        opts.limit ?? Infinity,
        read,
        print,
      )
    }
    return
  }

  const cursors = stats.map((s) => ({ partition: s.partition, next: startOf(opts, s.endOffset) }))
  let remaining = opts.limit ?? Infinity
  let waitMs = MIN_POLL_MS
  let lostMs: number | undefined // while the broker cannot be reached: the current wait between tries
  while (!signal.aborted) {
    let round: Message[]
    try {
      round = await pollRound(cursors, Math.min(PAGE, remaining), read)
    } catch (err) {
      if (signal.aborted || !isPassing(err)) throw err
      // A broker restart, or a network blip: keep following from the same offsets once it is back.
      if (lostMs === undefined) {
        note(
          `hookq: ${err instanceof Error ? err.message : String(err)}; still following, retrying ` +
            `(backing off to ${RECONNECT_MAX_MS / 1000} s) until it answers again; Ctrl-C to stop`,
        )
      }
      lostMs = lostMs === undefined ? RECONNECT_MIN_MS : Math.min(RECONNECT_MAX_MS, lostMs * 2)
      await sleep(lostMs, signal)
      continue
    }
    if (lostMs !== undefined) {
      note('hookq: the broker answers again; following')
      lostMs = undefined
    }
    if (round.length > 0) {
      // Across partitions, in time order within one round of polls.
      for (const m of round.sort(byTime)) {
        print(m)
        if (--remaining <= 0) return
      }
      waitMs = MIN_POLL_MS
    } else {
      await sleep(waitMs, signal)
      waitMs = Math.min(opts.maxPollMs, waitMs * 2)
    }
  }
}

/**
 * One poll of every cursor. The cursors move only when every read succeeded, so a round cut short
 * by a lost broker is read again whole, and nothing is skipped or printed twice.
 */
async function pollRound(cursors: Array<{ partition: number; next: number }>, limit: number, read: Reader): Promise<Message[]> {
  const pages = []
  for (const c of cursors) pages.push(await read(c.partition, c.next, limit))
  pages.forEach((page, i) => {
    cursors[i]!.next = page.nextOffset
  })
  return pages.flatMap((page) => page.messages)
}

/**
 * Failures a follow waits out: the broker unreachable (restarting, a network blip) or answering
 * 5xx (e.g. while its database restarts). 429/503 are already waited out by withRetries.
 */
function isPassing(err: unknown): boolean {
  return err instanceof UnreachableError || (err instanceof HookqError && err.status >= 500)
}

/** Reads one page of a partition (with retries on 429/503). */
type Reader = (partition: number, fromOffset: number, limit: number) => Promise<{ messages: Message[]; nextOffset: number }>

/** A partition read from `next` up to `end` (exclusive), a page at a time. */
interface Cursor {
  partition: number
  next: number
  end: number
}

/**
 * `--limit n` alone: the newest n messages (of the topic, or of --partition), oldest first. Each
 * partition's last n are the only candidates, so nothing before `end - n` is read.
 */
async function printNewest(
  stats: Array<{ partition: number; endOffset: number }>,
  limit: number,
  read: Reader,
  print: (m: Message) => void,
): Promise<void> {
  const candidates: Message[] = []
  for (const s of stats) {
    const cursor = { partition: s.partition, next: Math.max(0, s.endOffset - limit), end: s.endOffset }
    for (;;) {
      // ends: every page moves the cursor towards its end
      const page = await nextPage(cursor, Infinity, read)
      if (page.length === 0) break
      candidates.push(...page)
    }
  }
  for (const m of candidates.sort(byTime).slice(-limit)) print(m)
}

/**
 * Every partition from its cursor to its end, merged in time order and printed as it goes, until
 * `limit` messages are printed. Each partition holds at most one page, of no more than is left to
 * print, so memory stays at a page a partition however long the topic is.
 */
async function printMerged(cursors: Cursor[], limit: number, read: Reader, print: (m: Message) => void): Promise<void> {
  const buffers = cursors.map(() => ({ messages: [] as Message[], at: 0 }))
  for (let printed = 0; printed < limit; printed++) {
    let oldest: { messages: Message[]; at: number } | undefined
    for (const [i, cursor] of cursors.entries()) {
      const buffer = buffers[i]!
      if (buffer.at >= buffer.messages.length) {
        buffer.messages = await nextPage(cursor, limit - printed, read)
        buffer.at = 0
      }
      const head = buffer.messages[buffer.at]
      if (head !== undefined && (oldest === undefined || byTime(head, oldest.messages[oldest.at]!) < 0)) oldest = buffer
    }
    if (oldest === undefined) return // every partition is at its end
    print(oldest.messages[oldest.at++]!)
  }
}

/** The next page of a cursor (at most `wanted` messages), advancing it; empty at the end. */
async function nextPage(cursor: Cursor, wanted: number, read: Reader): Promise<Message[]> {
  if (cursor.next >= cursor.end) return []
  const page = await read(cursor.partition, cursor.next, Math.min(PAGE, cursor.end - cursor.next, wanted))
  const mine = page.messages.filter((m) => m.offset < cursor.end)
  // An empty page before the end (messages removed meanwhile): the partition has nothing more to give.
  cursor.next = mine.length === 0 ? cursor.end : mine.at(-1)!.offset + 1
  return mine
}

/** Time order across partitions; within one partition, offset order. */
function byTime(a: Message, b: Message): number {
  return a.timestamp.localeCompare(b.timestamp) || a.partition - b.partition || a.offset - b.offset
}

function startOf(opts: TailOptions, endOffset: number): number {
  if (opts.last !== undefined) return Math.max(0, endOffset - opts.last)
  if (opts.from === undefined) return opts.follow === true ? endOffset : Math.max(0, endOffset - DEFAULT_LAST)
  if (opts.from === 'beginning') return 0
  if (opts.from === 'end') return endOffset
  if (!/^\d+$/.test(opts.from)) throw new UsageError(`--from takes an offset, "beginning" or "end", got ${JSON.stringify(opts.from)}`)
  return Number(opts.from)
}

function fetchPage(client: HookqClient, topic: string, partition: number, fromOffset: number, limit: number, signal: AbortSignal) {
  return unwrap(
    client.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
      params: { path: { topic, partition }, query: { fromOffset, limit } },
      signal,
    }),
  )
}

/**
 * `0:41 2026-11-30T06:00:00.000Z key=user-42 {"any":"json"} headers={"k":"v"}`: the producer's text
 * with every control character escaped, so a message cannot move the cursor or reorder the line.
 */
function lineOf(m: Message): string {
  const headers = Object.keys(m.headers).length > 0 ? ` headers=${visibleJson(JSON.stringify(m.headers))}` : ''
  return `${m.partition}:${m.offset} ${m.timestamp} key=${m.key === null ? '-' : visible(m.key)} ${visibleJson(JSON.stringify(m.value))}${headers}`
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, timerDelayMs(ms))
    function done() {
      clearTimeout(timer)
      signal.removeEventListener('abort', done)
      resolve()
    }
    signal.addEventListener('abort', done, { once: true })
  })
}

/**
 * A message's line, or (for a value nested deeper than JSON.stringify's stack: hookq_produce() took
 * such values before it checked nesting) the line without its value, saying so.
 */
function printable(m: Message, json: boolean): string {
  try {
    return json ? visibleJson(JSON.stringify(m)) : lineOf(m)
  } catch (err) {
    if (!(err instanceof RangeError)) throw err
    const note = 'value nested too deeply to print'
    return json ? visibleJson(JSON.stringify({ ...m, value: null, valueError: note })) : lineOf({ ...m, value: `(${note})` })
  }
}

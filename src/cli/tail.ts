/**
 * `hookq tail <topic>`: print a topic's messages, one line each (NDJSON with --json), from an
 * offset or the last few; with --follow, keep polling for new ones until Ctrl-C (which exits 0).
 * Polling backs off from 100 ms to --max-poll-ms while nothing arrives and snaps back when
 * something does, so an idle tail costs a request every couple of seconds.
 */
import type { Command } from 'commander'
import { unwrap, withRetries, type HookqClient, type Message } from '@hookq/client'
import { wholeNumber } from './args.ts'
import { contextOf, type CliContext } from './context.ts'
import { printLine, UsageError } from './output.ts'

interface TailOptions {
  partition?: number
  from?: string
  last?: number
  follow?: boolean
  limit?: number
  maxPollMs: number
}

// Without --follow and without --from/--last, a tail shows this many messages a partition, like tail(1).
const DEFAULT_LAST = 10
const MIN_POLL_MS = 100
const PAGE = 1000

/** Adds `tail` to `program`. */
export function registerTail (program: Command): void {
  program.command('tail <topic>')
    .description('print messages of a topic (every partition, or one), and with --follow keep printing new ones')
    .option('-p, --partition <n>', 'only this partition', wholeNumber(0, 2_147_483_647))
    .option('--from <offset>', 'first offset of each partition: a number, "beginning" or "end" (default end with --follow)')
    .option('-n, --last <n>', `start this many messages before the end of each partition (default ${DEFAULT_LAST} without --follow)`, wholeNumber(0))
    .option('-f, --follow', 'keep polling for new messages until Ctrl-C')
    .option('--limit <n>', 'stop after this many messages', wholeNumber(1))
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

async function tail (ctx: CliContext, topic: string, opts: TailOptions): Promise<void> {
  const signal = ctx.signal!
  const retry = { signal }
  const detail = await withRetries(() => unwrap(ctx.client.GET('/v1/topics/{topic}', { params: { path: { topic } }, signal })), retry)
  if (opts.partition !== undefined && opts.partition >= detail.partitions) {
    throw new UsageError(`topic ${topic} has ${detail.partitions} partitions (0 to ${detail.partitions - 1}); there is no partition ${opts.partition}`)
  }
  const stats = detail.partitionStats.filter((s) => opts.partition === undefined || s.partition === opts.partition)
  const cursors = stats.map((s) => ({ partition: s.partition, next: startOf(opts, s.endOffset), end: s.endOffset }))
  let printed = 0
  const print = (messages: Message[]): boolean => {
    // Across partitions, in time order within one round of polls.
    messages.sort((a, b) => a.timestamp.localeCompare(b.timestamp) || a.partition - b.partition || a.offset - b.offset)
    for (const m of messages) {
      printLine(ctx.json ? JSON.stringify(m) : lineOf(m))
      if (opts.limit !== undefined && ++printed >= opts.limit) return false
    }
    return true
  }

  if (opts.follow !== true) {
    // Up to the end offsets seen at the start: a plain tail ends even while producers keep going.
    const batch: Message[] = []
    for (const c of cursors) {
      while (c.next < c.end) {
        const page = await fetchPage(ctx.client, topic, c.partition, c.next, Math.min(PAGE, c.end - c.next), signal)
        const mine = page.messages.filter((m) => m.offset < c.end)
        if (mine.length === 0) break
        batch.push(...mine)
        c.next = mine.at(-1)!.offset + 1
      }
    }
    print(batch)
    return
  }

  let waitMs = MIN_POLL_MS
  while (!signal.aborted) {
    const round: Message[] = []
    for (const c of cursors) {
      const page = await withRetries(() => fetchPage(ctx.client, topic, c.partition, c.next, PAGE, signal), retry)
      round.push(...page.messages)
      c.next = page.nextOffset
    }
    if (round.length > 0) {
      if (!print(round)) return
      waitMs = MIN_POLL_MS
    } else {
      await sleep(waitMs, signal)
      waitMs = Math.min(opts.maxPollMs, waitMs * 2)
    }
  }
}

function startOf (opts: TailOptions, endOffset: number): number {
  if (opts.last !== undefined) return Math.max(0, endOffset - opts.last)
  if (opts.from === undefined) return opts.follow === true ? endOffset : Math.max(0, endOffset - DEFAULT_LAST)
  if (opts.from === 'beginning') return 0
  if (opts.from === 'end') return endOffset
  if (!/^\d+$/.test(opts.from)) throw new UsageError(`--from takes an offset, "beginning" or "end", got ${JSON.stringify(opts.from)}`)
  return Number(opts.from)
}

function fetchPage (client: HookqClient, topic: string, partition: number, fromOffset: number, limit: number, signal: AbortSignal) {
  return unwrap(client.GET('/v1/topics/{topic}/partitions/{partition}/messages', {
    params: { path: { topic, partition }, query: { fromOffset, limit } }, signal,
  }))
}

/** `0:41 2026-11-30T06:00:00.000Z key=user-42 {"any":"json"} headers={"k":"v"}` */
function lineOf (m: Message): string {
  const headers = Object.keys(m.headers).length > 0 ? ` headers=${JSON.stringify(m.headers)}` : ''
  return `${m.partition}:${m.offset} ${m.timestamp} key=${m.key ?? '-'} ${JSON.stringify(m.value)}${headers}`
}

function sleep (ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms)
    function done () { clearTimeout(timer); signal.removeEventListener('abort', done); resolve() }
    signal.addEventListener('abort', done, { once: true })
  })
}

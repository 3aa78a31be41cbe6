/**
 * `hookq deliveries <group>`: the attempt log, newest first, filtered by partition, offset and
 * outcome. One page by default (`--cursor` continues, and the next cursor is printed on stderr);
 * `--all` follows nextCursor for up to --max-pages pages.
 */
import { Option, type Command } from 'commander'
import { unwrap, withRetries, type Delivery } from '@hookq/client'
import { partitionNumber, wholeNumber } from './args.ts'
import { contextOf } from './context.ts'
import { note, noteRetry, printJson, printTable, short } from './output.ts'

const OUTCOMES = ['acked', 'failed', 'timed_out', 'nacked', 'dead', 'in_flight'] as const

interface DeliveriesOptions {
  partition?: number
  offset?: number
  outcome?: (typeof OUTCOMES)[number]
  limit: number
  cursor?: string
  all?: boolean
  maxPages: number
}

/** Adds `deliveries` to `program`. */
export function registerDeliveries(program: Command): void {
  program
    .command('deliveries <group>')
    .description("a group's push attempts, newest first")
    .option('-p, --partition <n>', 'only this partition', partitionNumber)
    .option('-o, --offset <n>', 'only this offset (with --partition: one message)', wholeNumber(0))
    .addOption(new Option('--outcome <outcome>', 'only attempts with this outcome').choices(OUTCOMES))
    .option('--limit <n>', 'attempts a page, 1 to 1000', wholeNumber(1, 1000), 100)
    .option('--cursor <cursor>', 'continue from the cursor a previous page printed')
    .option('--all', 'follow the pages to the end (at most --max-pages)')
    .option('--max-pages <n>', 'pages --all reads at most', wholeNumber(1, 100_000), 100)
    .action(async (group: string, opts: DeliveriesOptions, cmd: Command) => {
      const ctx = contextOf(cmd)
      const deliveries: Delivery[] = []
      let cursor = opts.cursor
      const pages = opts.all === true ? opts.maxPages : 1
      for (let page = 0; page < pages; page++) {
        const query = {
          limit: opts.limit,
          ...(opts.partition === undefined ? {} : { partition: opts.partition }),
          ...(opts.offset === undefined ? {} : { offset: opts.offset }),
          ...(opts.outcome === undefined ? {} : { outcome: opts.outcome }),
          ...(cursor === undefined ? {} : { cursor }),
        }
        const answer = await withRetries(
          () => unwrap(ctx.client.GET('/v1/groups/{group}/deliveries', { params: { path: { group }, query } })),
          { onRetry: noteRetry },
        )
        deliveries.push(...answer.deliveries)
        cursor = answer.nextCursor ?? undefined
        if (cursor === undefined) break
      }
      if (ctx.json) return printJson({ deliveries, nextCursor: cursor ?? null })
      printTable(
        ['started', 'message', 'attempt', 'outcome', 'status', 'ms', 'consumer', 'error'],
        deliveries.map((d) => [
          d.startedAt,
          `${d.partition}:${d.offset}`,
          d.attempt,
          d.outcome,
          d.statusCode,
          d.durationMs,
          d.consumerId === null ? null : short(d.consumerId, 8),
          short(d.error, 50),
        ]),
      )
      if (cursor !== undefined) {
        note(
          opts.all === true
            ? `hookq: stopped after ${opts.maxPages} pages; continue with --cursor ${cursor}`
            : `hookq: more attempts: --cursor ${cursor} (or --all)`,
        )
      }
    })
}

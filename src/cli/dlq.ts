/**
 * `hookq dlq replay <dlqTopic>`: produce dead letters back to the topics they came from, through
 * the SDK's `replayDeadLetters` (idempotent: a second replay of the same dead letters stores
 * nothing). Exit 0 when every dead letter read was replayed (or was already), 1 when some were
 * skipped (not a dead letter, or their topic is gone) or the broker answered an error.
 */
import type { Command } from 'commander'
import { replayDeadLetters, type ReplayProgress, type ReplaySummary } from '@hookq/client'
import { partitionNumber, wholeNumber } from './args.ts'
import { contextOf } from './context.ts'
import { CliError, count, EXIT, ExplainedError, note, noteRetry, printJson, printLine, printTable, startProgress } from './output.ts'

interface ReplayCliOptions {
  fromOffset?: number
  limit?: number
  partition?: number
  dryRun?: boolean
  batchSize: number
}

/** Adds the `dlq` command group to `program`. */
export function registerDlq(program: Command): void {
  const dlq = program.command('dlq').description('dead-letter topics')

  dlq
    .command('replay <dlqTopic>')
    .description('produce dead letters back to their topic (named by their hookq-dlq-topic header), without duplicates')
    .option('--from-offset <n>', 'first offset read in each partition of the dead-letter topic', wholeNumber(0))
    .option('--limit <n>', 'replay at most this many dead letters', wholeNumber(1))
    .option('-p, --partition <n>', 'only this partition of the dead-letter topic', partitionNumber)
    .option('--dry-run', 'read and count, produce nothing')
    .option('--batch-size <n>', 'dead letters read and produced a round, 1 to 1000', wholeNumber(1, 1000), 200)
    .action(async (dlqTopic: string, opts: ReplayCliOptions, cmd: Command) => {
      const ctx = contextOf(cmd)
      let last: ReplayProgress | undefined
      const bar = startProgress(opts.dryRun === true ? `read ${dlqTopic}` : `replay ${dlqTopic}`, 0, ctx.progress, 'dead letters')
      let summary: ReplaySummary
      try {
        summary = await replayDeadLetters(ctx.client, dlqTopic, {
          fromOffset: opts.fromOffset,
          limit: opts.limit,
          partitions: opts.partition === undefined ? undefined : [opts.partition],
          dryRun: opts.dryRun === true,
          batchSize: opts.batchSize,
          onRetry: noteRetry,
          onProgress: (p) => {
            last = p
            bar.update(p.read, p.total)
          },
        })
      } catch (err) {
        bar.stop()
        if (err instanceof RangeError) throw new CliError(err.message, EXIT.usage)
        const done =
          last === undefined || last.read === 0
            ? []
            : [
                `${count(last.replayed, 'dead letter')} ${last.replayed === 1 ? 'was' : 'were'} replayed before the error (${last.duplicates} already ${last.duplicates === 1 ? 'was' : 'were'}); replaying again will not duplicate them`,
              ]
        throw new ExplainedError(err, done)
      }
      bar.stop()
      report(summary, ctx.json)
      if (summary.skipped > 0) {
        throw new CliError(
          `${count(summary.skipped, 'dead letter')} ${summary.skipped === 1 ? 'was' : 'were'} skipped (not replayed)${ctx.json ? '' : '; see above'}`,
          EXIT.broker,
        )
      }
    })
}

/**
 * A dry run produces nothing, so nothing was replayed: `replayed` 0, `wouldReplay` what a real run
 * would produce now, `duplicates` the dead letters it would find already replayed (the broker's
 * answer for their idempotency keys, as a real run's produce gets it).
 */
function dryRunJson(s: ReplaySummary) {
  const byTopic = Object.fromEntries(
    Object.entries(s.byTopic).map(([t, c]) => [t, { wouldReplay: c.replayed, replayed: 0, duplicates: c.duplicates }]),
  )
  return { ...s, wouldReplay: s.replayed, replayed: 0, byTopic }
}

function report(s: ReplaySummary, json: boolean): void {
  if (json) return printJson(s.dryRun ? dryRunJson(s) : s)
  const verb = s.dryRun ? 'would replay' : 'replayed'
  printLine(
    `${verb} ${s.replayed} of ${count(s.read, 'dead letter')} read from ${s.dlqTopic}` +
      (s.duplicates > 0
        ? `; ${s.duplicates} had been replayed before and ${s.dryRun ? 'would not be' : s.duplicates === 1 ? 'was not' : 'were not'} produced again`
        : '') +
      (s.skipped > 0 ? `; ${s.skipped} skipped` : ''),
  )
  const topics = Object.entries(s.byTopic)
  if (topics.length > 0) {
    printTable(
      ['topic', s.dryRun ? 'would replay' : 'replayed', 'already replayed'],
      topics.map(([t, c]) => [t, c.replayed, c.duplicates]),
    )
  }
  if (s.skips.length > 0) {
    printLine('')
    printTable(
      ['skipped', 'reason'],
      s.skips.map((k) => [`${k.partition}:${k.offset}`, k.reason]),
    )
    if (s.skipped > s.skips.length) printLine(`... and ${s.skipped - s.skips.length} more`)
  }
  const resume = s.partitions.filter((p) => p.nextOffset > p.fromOffset)
  if (resume.length > 0 && !s.dryRun) {
    note(`hookq: read ${s.dlqTopic} up to ${resume.map((p) => `offset ${p.nextOffset - 1} of partition ${p.partition}`).join(', ')}`)
  }
}

/**
 * `hookq seek <group>`: move a group's committed offsets to an offset or a time, on one partition
 * or all, to replay or to skip messages.
 */
import type { Command } from 'commander'
import { unwrap } from '@hookq/client'
import { partitionNumber, timestamp, wholeNumber } from './args.ts'
import { contextOf } from './context.ts'
import { printJson, printLine, printTable, UsageError } from './output.ts'

interface SeekOptions {
  partition?: number
  offset?: number
  timestamp?: string
}

/** Adds `seek` to `program`. */
export function registerSeek(program: Command): void {
  program
    .command('seek <group>')
    .description("move a group's committed offsets (every partition, or one) to an offset or a time")
    .option('-p, --partition <n>', 'only this partition', partitionNumber)
    .option('-o, --offset <n>', 'the new committed offset (at most the end offset)', wholeNumber(0))
    .option('--timestamp <iso>', 'per partition, the first offset produced at or after this time', timestamp)
    .addHelpText(
      'after',
      '\nExamples:\n  hookq seek billing --offset 0                 replay every partition from the start\n' +
        '  hookq seek billing -p 2 --offset 120          replay partition 2 from offset 120\n' +
        '  hookq seek billing --timestamp 2026-01-01T00:00:00Z',
    )
    .action(async (group: string, opts: SeekOptions, cmd: Command) => {
      if ((opts.offset === undefined) === (opts.timestamp === undefined))
        throw new UsageError('seek needs exactly one of --offset and --timestamp')
      const ctx = contextOf(cmd)
      const body = {
        ...(opts.partition === undefined ? {} : { partition: opts.partition }),
        ...(opts.offset === undefined ? {} : { offset: opts.offset }),
        ...(opts.timestamp === undefined ? {} : { timestamp: opts.timestamp }),
      }
      const answer = await unwrap(ctx.client.POST('/v1/groups/{group}/seek', { params: { path: { group } }, body }))
      if (ctx.json) return printJson(answer)
      const target = opts.offset !== undefined ? `offset ${opts.offset}` : `time ${opts.timestamp}`
      printLine(`moved group ${group} (${opts.partition === undefined ? 'every partition' : `partition ${opts.partition}`}) to ${target}`)
      printTable(
        ['partition', 'committed'],
        answer.partitions.map((p) => [p.partition, p.committedOffset]),
      )
    })
}

/** `hookq schedules put|list|get|delete`: schedules and a table of their next runs. */
import { InvalidArgumentError, type Command } from 'commander'
import { unwrap, type Schedule, type ScheduleConfig } from '@hookq/client'
import { headerPair, oneOf, wholeNumber } from './args.ts'
import { contextOf, unwrapWithStatus } from './context.ts'
import { printJson, printLine, printTable } from './output.ts'
import { duration } from './topics.ts'

interface PutOptions {
  topic: string
  cron?: string
  every?: number
  timeZone?: string
  value: unknown
  key?: string
  header?: Record<string, string>
  paused?: boolean
  missed?: 'skip' | 'once'
}

/** Adds the `schedules` command group to `program`. */
export function registerSchedules(program: Command): void {
  const schedules = program.command('schedules').description('messages produced on a cron or interval schedule')

  schedules
    .command('put <name>')
    .description('create or replace a schedule (exactly one of --cron and --every)')
    .requiredOption('-t, --topic <topic>', 'the topic each tick produces to')
    .option('--cron <expr>', "5 fields, or 6 with seconds first, e.g. '0 9 * * MON-FRI'")
    .option('--every <ms>', 'a tick every this many ms (at least 1000), on the Unix epoch plus multiples', wholeNumber(1000))
    .option('-z, --time-zone <zone>', 'IANA time zone of the cron (default UTC)')
    .requiredOption('-v, --value <json>', "the message's value, as JSON", jsonValue)
    .option('-k, --key <key>', "the message's key")
    .option('-H, --header <name=value>', 'a header of the message (repeatable)', headerPair)
    .option('--paused', 'create it paused: no ticks until it is put again without --paused')
    .option('--missed <policy>', 'ticks passed while no broker ran: skip (default) or once', oneOf(['skip', 'once'] as const))
    .action(async (name: string, opts: PutOptions, cmd: Command) => {
      const ctx = contextOf(cmd)
      const body: ScheduleConfig = {
        topic: opts.topic,
        message: {
          value: opts.value,
          ...(opts.key !== undefined ? { key: opts.key } : {}),
          ...(opts.header ? { headers: opts.header } : {}),
        },
        ...(opts.cron !== undefined ? { cron: opts.cron } : {}),
        ...(opts.every !== undefined ? { every: opts.every } : {}),
        ...(opts.timeZone !== undefined ? { timeZone: opts.timeZone } : {}),
        ...(opts.paused ? { paused: true } : {}),
        ...(opts.missed !== undefined ? { missed: opts.missed } : {}),
      }
      const { data: schedule, status } = await unwrapWithStatus(
        ctx.client.PUT('/v1/schedules/{name}', { params: { path: { name } }, body }),
      )
      if (ctx.json) return printJson(schedule)
      printLine(`${status === 201 ? 'created' : 'replaced'}: schedule ${schedule.name}, ${timing(schedule)} to topic ${schedule.topic}`)
      printRuns(schedule)
    })

  schedules
    .command('list')
    .alias('ls')
    .description('list schedules with their next run and last tick')
    .action(async (_opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { schedules: list } = await unwrap(ctx.client.GET('/v1/schedules'))
      if (ctx.json) return printJson({ schedules: list })
      printTable(
        ['name', 'topic', 'timing', 'time zone', 'next run', 'last tick'],
        list.map((s: Schedule) => [
          s.name,
          s.topic,
          timing(s),
          s.timeZone,
          s.paused ? 'paused' : (s.nextRuns[0] ?? '-'),
          s.lastTickAt ?? '-',
        ]),
      )
    })

  schedules
    .command('get <name>')
    .alias('show')
    .description('show a schedule and a table of its next 5 runs')
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const schedule = await unwrap(ctx.client.GET('/v1/schedules/{name}', { params: { path: { name } } }))
      if (ctx.json) return printJson(schedule)
      printLine(
        `schedule ${schedule.name}: ${timing(schedule)} (${schedule.timeZone}) to topic ${schedule.topic}, missed: ${schedule.missed}, last tick ${schedule.lastTickAt ?? 'none yet'}`,
      )
      printRuns(schedule)
    })

  schedules
    .command('delete <name>')
    .alias('rm')
    .description('delete a schedule: no tick follows')
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/schedules/{name}', { params: { path: { name } } }))
      if (ctx.json) return printJson({ deleted: name })
      printLine(`deleted: schedule ${name}`)
    })
}

function timing(s: Schedule): string {
  return s.cron !== undefined ? `cron '${s.cron}'` : `every ${duration(s.every ?? 0)}`
}

/** The next runs, in UTC and in the schedule's zone; a line saying so when paused. */
function printRuns(s: Schedule): void {
  if (s.paused) return printLine('paused: no next runs')
  const local = new Intl.DateTimeFormat('sv-SE', {
    timeZone: s.timeZone,
    dateStyle: 'short',
    timeStyle: 'medium',
  })
  printTable(
    ['next run (UTC)', `local (${s.timeZone})`],
    s.nextRuns.map((run) => [run, local.format(new Date(run))]),
  )
}

function jsonValue(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    throw new InvalidArgumentError('not JSON; write strings as JSON (\'"text"\')')
  }
}

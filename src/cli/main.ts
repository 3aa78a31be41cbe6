/**
 * The hookq command line: one commander program, a file per command group. `main` runs it and
 * turns the outcome into the exit code (0 success, 1 broker error, 2 usage error, 3 broker
 * unreachable; see output.ts). The bin entry, hookq.mjs, loads this file through tsx.
 */
import { readFileSync } from 'node:fs'
import { Command, CommanderError, Option } from 'commander'
import { DEFAULT_URL } from '@hookq/client'
import { wholeNumber } from './args.ts'
import { DEFAULT_TIMEOUT_MS } from './context.ts'
import { registerConsumers } from './consumers.ts'
import { registerDeliveries } from './deliveries.ts'
import { registerDlq } from './dlq.ts'
import { registerKeys } from './keys.ts'
import { EXIT, reportError } from './output.ts'
import { registerProduce } from './produce.ts'
import { registerSecrets } from './secrets.ts'
import { registerSchedules } from './schedules.ts'
import { registerSeek } from './seek.ts'
import { registerServe } from './serve.ts'
import { registerPull } from './pull.ts'
import { registerTail } from './tail.ts'
import { registerTopics } from './topics.ts'

const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

/**
 * The whole program, with its global options; commander errors are thrown (exitOverride), not exited on.
 * `hookq groups` gets its commands from `registerGroups` (groups.ts), given only when it is named:
 * its flags come from the group settings table, whose TypeBox schemas took ~0.4 s of CPU to load at
 * every start of every other command.
 */
export function buildProgram(registerGroups?: (groups: Command) => void): Command {
  const program = new Command('hookq')
    .description(
      'command line for the hookq broker: topics, produce, groups, consumers, tail, pull, deliveries, seek, dead letters, schedules, API keys',
    )
    .version(version, '-V, --version')
    .addOption(new Option('--url <url>', `broker URL (default ${DEFAULT_URL})`).env('HOOKQ_URL'))
    .addOption(new Option('--api-key <key>', 'API key, sent as a bearer token').env('HOOKQ_API_KEY'))
    .option('--json', 'print JSON for scripts instead of tables')
    .option('--no-progress', 'no progress bars (they only ever show on a terminal)')
    .option('--timeout <ms>', `time one call may take (default ${DEFAULT_TIMEOUT_MS})`, wholeNumber(1))
    .exitOverride()
    .showSuggestionAfterError()
    .configureHelp({ showGlobalOptions: true, sortSubcommands: false })
    .addHelpText('after', '\nExit codes: 0 success, 1 the broker answered an error, 2 usage error, 3 broker unreachable.')
  registerServe(program)
  registerTopics(program)
  registerProduce(program)
  const groups = program.command('groups').description('create, update, inspect and delete consumer groups')
  registerGroups?.(groups)
  registerConsumers(program)
  registerTail(program)
  registerPull(program)
  registerDeliveries(program)
  registerSeek(program)
  registerDlq(program)
  registerKeys(program)
  registerSecrets(program)
  registerSchedules(program)
  return program
}

/** Runs the CLI on `argv` (process.argv layout) and returns the exit code. */
export async function main(argv: string[] = process.argv): Promise<number> {
  // `hookq tail -f | head` closes stdout under us: that is a normal end, not a crash.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(EXIT.ok)
    throw err
  })
  try {
    // A topic or value spelled "groups" loads it too: only slower, never wrong.
    const groups = argv.slice(2).includes('groups') ? (await import('./groups.ts')).registerGroups : undefined
    await buildProgram(groups).parseAsync(argv)
    return EXIT.ok
  } catch (err) {
    if (err instanceof CommanderError) {
      // commander has printed the message (or the help) already.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage
    }
    return reportError(err, argv.includes('--json'))
  }
}

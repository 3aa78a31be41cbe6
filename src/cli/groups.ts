/** `hookq groups create|update|list|status|pause|resume|delete`. */
import { Option, type Command } from 'commander'
import { unwrap, type GroupConfig, type GroupStatus, type HookqClient } from '@hookq/client'
import { decimal, jsonObject, wholeNumber } from './args.ts'
import { contextOf, unwrapWithStatus, type CliContext } from './context.ts'
import { printJson, printLine, printTable, short } from './output.ts'
import { duration } from './topics.ts'

/** The group options as commander parses them; each one left out keeps its current (or default) value. */
interface GroupOptions {
  topic?: string
  ackMode?: 'explicit' | 'auto'
  ackTimeoutMs?: number
  maxDeliveries?: number
  deadLetterTopic?: string | false
  startAt?: string
  maxInFlight?: number
  ordered?: boolean
  ordering?: 'none' | 'partition' | 'key'
  pushTimeoutMs?: number
  pushFormat?: 'envelope' | 'raw'
  paused?: boolean
  retryInitialDelayMs?: number
  retryMultiplier?: number
  retryMaxDelayMs?: number
  retryJitter?: number
  batchMaxMessages?: number
  batchMaxWaitMs?: number
  batchMaxBytes?: number
  /** false: --no-batch */
  batch?: false
  /** A filter as JSON, or false (--no-filter) to remove it. */
  filter?: Record<string, unknown> | false
}

/** Adds the `groups` command group to `program`. */
export function registerGroups(program: Command): void {
  const groups = program.command('groups').description('create, update, inspect and delete consumer groups')

  configOptions(
    groups
      .command('create <name>')
      .description('create a group consuming a topic (or update it: options left out keep their values)')
      .requiredOption('-t, --topic <topic>', 'the topic the group consumes (fixed once created)'),
  ).action(async (name: string, opts: GroupOptions, cmd: Command) => put(contextOf(cmd), name, opts))

  configOptions(
    groups
      .command('update <name>')
      .description('change settings of a group; options left out keep their values')
      .option('-t, --topic <topic>', 'the topic the group consumes (must be the current one)'),
  ).action(async (name: string, opts: GroupOptions, cmd: Command) => put(contextOf(cmd), name, opts))

  groups
    .command('list')
    .alias('ls')
    .description('list groups')
    .action(async (_opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { groups: list } = await unwrap(ctx.client.GET('/v1/groups'))
      if (ctx.json) return printJson({ groups: list })
      printTable(
        ['name', 'topic', 'ack mode', 'max deliveries', 'dead letters', 'ordering', 'paused'],
        list.map((g) => [g.name, g.topic, g.ackMode, g.maxDeliveries, g.deadLetterTopic, g.ordering, g.paused ? 'yes' : 'no']),
      )
    })

  groups
    .command('status <name>')
    .alias('show')
    .description('show a group: settings, each partition (committed, end, lag, in flight, consumer) and its consumers')
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const status = await unwrap(ctx.client.GET('/v1/groups/{group}', { params: { path: { group: name } } }))
      if (ctx.json) return printJson(status)
      printStatus(status)
    })

  for (const [verb, paused] of [
    ['pause', true],
    ['resume', false],
  ] as const) {
    groups
      .command(`${verb} <name>`)
      .description(paused ? 'stop pushing new messages (acks still count)' : 'start pushing again')
      .action(async (name: string, _opts: object, cmd: Command) => put(contextOf(cmd), name, { paused }))
  }

  groups
    .command('delete <name>')
    .alias('rm')
    .description('delete a group with its offsets, consumers and attempt log')
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/groups/{group}', { params: { path: { group: name } } }))
      if (ctx.json) return printJson({ deleted: name })
      printLine(`deleted: group ${name}`)
    })
}

function configOptions(cmd: Command): Command {
  return cmd
    .addOption(
      new Option('--ack-mode <mode>', 'explicit: a 2xx means received, ack over HTTP; auto: a 2xx is the ack').choices([
        'explicit',
        'auto',
      ]),
    )
    .option('--ack-timeout-ms <ms>', 'time to ack a push before it is pushed again (default 30000)', wholeNumber(1000, 43_200_000))
    .option('--max-deliveries <n>', 'attempts before a message is dead-lettered (default 5)', wholeNumber(1, 1000))
    .option('--dead-letter-topic <topic>', 'where dead letters go (the topic must exist)')
    .option('--no-dead-letter-topic', 'record dead letters as dead instead of producing them to a topic')
    .option('--start-at <where>', 'where a new group starts: earliest (default), latest, or an ISO-8601 timestamp')
    .option('--max-in-flight <n>', 'messages in flight a partition at most (default 100)', wholeNumber(1, 10_000))
    .addOption(
      new Option(
        '--ordering <ordering>',
        'none (default): in parallel; partition: one message of a partition out at a time; ' +
          'key: one message per key out at a time, keys in parallel',
      ).choices(['none', 'partition', 'key']),
    )
    .option('--ordered', 'the same as --ordering partition')
    .option('--no-ordered', 'the same as --ordering none')
    .option('--push-timeout-ms <ms>', 'time a push may take (default 10000)', wholeNumber(100, 600_000))
    .addOption(
      new Option('--push-format <format>', 'envelope (default) or raw: the bare value, the rest in hookq-* headers').choices([
        'envelope',
        'raw',
      ]),
    )
    .option(
      '--batch-max-messages <n>',
      'batch push: up to n messages a push (the batch is given whole: set its other flags with it)',
      wholeNumber(1, 1000),
    )
    .option('--batch-max-wait-ms <ms>', 'batch push: wait this long for more messages after the first (default 0)', wholeNumber(0, 10_000))
    .option('--batch-max-bytes <n>', 'batch push: send before the body would pass n bytes', wholeNumber(1024, 16 * 1024 * 1024))
    .option('--no-batch', 'one message a push (the default)')
    .option('--filter <json>', 'push only the messages this filter matches, e.g. \'{"headers.type":"paid"}\'', jsonObject)
    .option('--no-filter', 'remove the filter: every message is pushed')
    .option('--paused', 'create or keep the group paused')
    .option('--no-paused', 'push (the default)')
    .option('--retry-initial-delay-ms <ms>', 'delay before the second attempt (default 1000)', wholeNumber(0, 86_400_000))
    .option('--retry-multiplier <x>', 'each further delay is this many times the last (default 2)', decimal(1, 100))
    .option('--retry-max-delay-ms <ms>', 'the longest delay (default 60000)', wholeNumber(0, 86_400_000))
    .option('--retry-jitter <fraction>', 'spread of each delay, 0 to 1 (default 0.1)', decimal(0, 1))
}

/** PUT the group; without --topic (update, pause, resume) the group's current topic is sent. */
async function put(ctx: CliContext, name: string, opts: GroupOptions): Promise<void> {
  const topic = opts.topic ?? (await currentTopic(ctx.client, name))
  const body = bodyOf(topic, opts)
  const { data: group, status } = await unwrapWithStatus(ctx.client.PUT('/v1/groups/{group}', { params: { path: { group: name } }, body }))
  if (ctx.json) return printJson(group)
  printLine(
    `${status === 201 ? 'created' : 'updated'}: group ${group.name} on topic ${group.topic}` +
      ` (ack ${group.ackMode}, max deliveries ${group.maxDeliveries}, dead letters ${group.deadLetterTopic ?? 'recorded only'}${group.paused ? ', paused' : ''})`,
  )
}

async function currentTopic(client: HookqClient, name: string): Promise<string> {
  const group = await unwrap(client.GET('/v1/groups/{group}', { params: { path: { group: name } } }))
  return group.topic
}

function bodyOf(topic: string, o: GroupOptions): GroupConfig {
  const body: GroupConfig = { topic }
  if (o.ackMode !== undefined) body.ackMode = o.ackMode
  if (o.ackTimeoutMs !== undefined) body.ackTimeoutMs = o.ackTimeoutMs
  if (o.maxDeliveries !== undefined) body.maxDeliveries = o.maxDeliveries
  if (o.deadLetterTopic !== undefined) body.deadLetterTopic = o.deadLetterTopic === false ? null : o.deadLetterTopic
  if (o.startAt !== undefined) body.startAt = o.startAt
  if (o.maxInFlight !== undefined) body.maxInFlight = o.maxInFlight
  if (o.ordered !== undefined) body.ordered = o.ordered
  if (o.ordering !== undefined) body.ordering = o.ordering
  if (o.pushTimeoutMs !== undefined) body.pushTimeoutMs = o.pushTimeoutMs
  if (o.pushFormat !== undefined) body.pushFormat = o.pushFormat
  if (o.paused !== undefined) body.paused = o.paused
  if (o.filter !== undefined) body.filter = o.filter === false ? null : o.filter
  if (o.batch === false) body.batch = null
  else if (o.batchMaxMessages !== undefined) {
    body.batch = {
      maxMessages: o.batchMaxMessages,
      ...(o.batchMaxWaitMs === undefined ? {} : { maxWaitMs: o.batchMaxWaitMs }),
      ...(o.batchMaxBytes === undefined ? {} : { maxBytes: o.batchMaxBytes }),
    }
  }
  const retry: NonNullable<GroupConfig['retry']> = {}
  if (o.retryInitialDelayMs !== undefined) retry.initialDelayMs = o.retryInitialDelayMs
  if (o.retryMultiplier !== undefined) retry.multiplier = o.retryMultiplier
  if (o.retryMaxDelayMs !== undefined) retry.maxDelayMs = o.retryMaxDelayMs
  if (o.retryJitter !== undefined) retry.jitter = o.retryJitter
  if (Object.keys(retry).length > 0) body.retry = retry
  return body
}

function printStatus(s: GroupStatus): void {
  const r = s.retry
  printLine(`group ${s.name} on topic ${s.topic}${s.paused ? ' (PAUSED)' : ''}`)
  printLine(
    `  ack ${s.ackMode}, ack timeout ${duration(s.ackTimeoutMs)}, push timeout ${duration(s.pushTimeoutMs)}, push format ${s.pushFormat}`,
  )
  printLine(
    `  max deliveries ${s.maxDeliveries}, retry ${r.initialDelayMs}ms ×${r.multiplier} up to ${r.maxDelayMs}ms ±${r.jitter * 100}%, dead letters ${s.deadLetterTopic ?? 'recorded only'}`,
  )
  printLine(`  max in flight ${s.maxInFlight}${s.ordering === 'none' ? '' : `, ordered by ${s.ordering}`}, start at ${s.startAt}`)
  if (s.filter) printLine(`  filter ${JSON.stringify(s.filter)}`)
  if (s.batch)
    printLine(
      `  batch push: up to ${s.batch.maxMessages} messages, wait ${s.batch.maxWaitMs} ms${s.batch.maxBytes === null ? '' : `, at most ${s.batch.maxBytes} bytes`}`,
    )
  printLine('')
  printTable(
    ['partition', 'committed', 'end', 'lag', 'in flight', 'filtered', 'consumer'],
    s.partitions.map((p) => [p.partition, p.committedOffset, p.endOffset, p.lag, p.inFlight, p.filtered, p.consumerId]),
  )
  printLine('')
  printTable(
    ['consumer', 'url', 'signed', 'state', 'created'],
    s.consumers.map((c) => [
      c.id,
      c.url,
      c.hasSecret === true ? 'yes' : 'no',
      c.disabled === true ? `disabled: ${short(c.disabledReason ?? '410 Gone', 40)}` : 'active',
      c.createdAt,
    ]),
  )
}

/** `hookq groups create|update|list|status|pause|resume|delete`. */
import { Option, type Command } from 'commander'
import { Type, type TSchema } from 'typebox'
import { unwrap, type GroupConfig, type GroupStatus, type HookqClient } from '@hookq/client'
import {
  description,
  flatName,
  GROUP_SETTINGS,
  whatNullDoes,
  type AliasSetting,
  type Setting,
  type ValueSetting,
} from '../core/group-settings.ts'
import { decimal, jsonObject, wholeNumber } from './args.ts'
import { contextOf, unwrapWithStatus, type CliContext } from './context.ts'
import { printJson, printLine, printTable, short } from './output.ts'
import { duration } from './topics.ts'

/**
 * The group options as commander parses them: a setting's flag is its flat name in kebab case
 * (ackTimeoutMs → --ack-timeout-ms, retry.jitter → --retry-jitter) and commander names the value by
 * the flat name again; --no-… gives false. Each one left out keeps its current (or default) value.
 */
type GroupOptions = { topic?: string } & Record<string, unknown>

/** Adds the `groups` command group to `program`. */
/** Adds the group commands to `hookq groups` (main.ts declares it, and loads this file only when it is named). */
export function registerGroups(groups: Command): void {
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

/** The flags of every setting of src/core/group-settings.ts, with their parsers and help. */
function configOptions(cmd: Command): Command {
  for (const [name, s] of Object.entries(GROUP_SETTINGS) as [string, Setting][]) {
    if (s.kind !== 'object') {
      addFlags(cmd, name, s)
      continue
    }
    for (const [member, m] of Object.entries(s.members)) addFlags(cmd, flatName(name, member), m, `${s.label.toLowerCase()}: `)
    if (s.nullable !== undefined) cmd.option(`--no-${kebab(name)}`, whatNullDoes({ nullable: s.nullable, default: null }))
  }
  return cmd
}

/** --name <value> (and --no-name for a nullable setting), or a boolean's --name and --no-name. */
function addFlags(cmd: Command, name: string, s: ValueSetting | AliasSetting, prefix = ''): void {
  const flag = `--${kebab(name)}`
  if (Type.IsBoolean(s.schema)) {
    const isDefault = (v: boolean) => (s.kind === 'value' && s.default === v ? ' (the default)' : '')
    cmd.option(flag, `${s.cli?.on}${isDefault(true)}`).option(`--no-${kebab(name)}`, `${s.cli?.off}${isDefault(false)}`)
    return
  }
  if (s.kind === 'alias') throw new Error(`groups: no flag for the alias ${name}`)
  const option = new Option(`${flag} <${placeholder(name, s)}>`, prefix + help(s))
  if (s.choices) option.choices(Object.keys(s.choices))
  else {
    const parse = parserOf(s.schema)
    if (parse) option.argParser(parse)
  }
  cmd.addOption(option)
  if (s.nullable !== undefined) cmd.option(`--no-${kebab(name)}`, whatNullDoes(s))
}

/** A flag's help: the API's description of the setting (what it is, its default), null aside. */
function help(s: ValueSetting): string {
  const text = description(s, false)
  // "Time to ack …" → "time to ack …", as all help starts; "RFC …" stays.
  const what = /^[A-Z](?![A-Z])/.test(text) ? text[0]!.toLowerCase() + text.slice(1) : text
  return `${what}${s.cli?.note ? ` (${s.cli.note})` : ''}`
}

/** The value's placeholder: ms for a …Ms name, n for an integer, x for a number, or the name's last word. */
function placeholder(name: string, s: ValueSetting): string {
  if (s.cli?.arg) return s.cli.arg
  if (name.endsWith('Ms')) return 'ms'
  if (Type.IsInteger(s.schema)) return 'n'
  if (Type.IsNumber(s.schema)) return 'x'
  return kebab(name).split('-').at(-1)!
}

/** The parser the schema calls for, with its bounds: a whole number, a number, or a JSON object. */
function parserOf(schema: TSchema): ((text: string) => unknown) | undefined {
  const { minimum, maximum } = schema as { minimum?: number; maximum?: number }
  if (Type.IsInteger(schema)) return wholeNumber(minimum, maximum)
  if (Type.IsNumber(schema)) return decimal(minimum ?? -Number.MAX_VALUE, maximum ?? Number.MAX_VALUE)
  if (Type.IsRecord(schema)) return jsonObject
  return undefined
}

function kebab(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)
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

/**
 * The PUT body of the settings given as flags. --no-… is null for a nullable setting (false for a
 * boolean); an object's member flags make the object (given whole for batch, so its other members
 * take their defaults: the broker says so when a required one is missing).
 */
function bodyOf(topic: string, o: GroupOptions): GroupConfig {
  const body: Record<string, unknown> = { topic }
  for (const [name, s] of Object.entries(GROUP_SETTINGS) as [string, Setting][]) {
    if (s.kind !== 'object') {
      if (o[name] !== undefined) body[name] = o[name] === false && s.kind === 'value' && s.nullable !== undefined ? null : o[name]
      continue
    }
    // --no-batch alone makes commander default `batch` to true: only false means it was given.
    if (s.nullable !== undefined && o[name] === false) {
      body[name] = null
      continue
    }
    const members = Object.keys(s.members).flatMap((member) => {
      const value = o[flatName(name, member)]
      return value === undefined ? [] : [[member, value] as const]
    })
    if (members.length > 0) body[name] = Object.fromEntries(members)
  }
  return body as GroupConfig
}

function printStatus(s: GroupStatus): void {
  const r = s.retry
  printLine(`group ${s.name} on topic ${s.topic}${s.delivery === 'pull' ? ' (pull delivery)' : ''}${s.paused ? ' (PAUSED)' : ''}`)
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

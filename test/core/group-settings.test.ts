/**
 * The settings table (src/core/group-settings.ts) is the one source of a group's settings: walking it,
 * every setting is in the OpenAPI document with its default in the description, has its flags in
 * the CLI, has its column in consumer_groups, and a group created with no settings reports every
 * default the table gives.
 */
import { readFile } from 'node:fs/promises'
import t from '../helpers/tap.ts'
import type { Command, Option } from 'commander'
import { registerGroups } from '../../src/cli/groups.ts'
import { buildProgram } from '../../src/cli/main.ts'
import { Prisma } from '../../src/generated/prisma/browser.ts'
import { flatName, GROUP_SETTINGS, type ObjectSetting, type Setting, type ValueSetting } from '../../src/core/group-settings.ts'
import { startBroker } from '../helpers/broker.ts'

const settings = Object.entries(GROUP_SETTINGS) as [string, Setting][]

/** Each value setting, with its flat name (retry.jitter → retryJitter) and the object it is a member of. */
const values = settings.flatMap(([name, s]): { flat: string; s: ValueSetting; of?: { object: ObjectSetting; member: string } }[] => {
  if (s.kind === 'value') return [{ flat: name, s }]
  if (s.kind === 'alias') return []
  return Object.entries(s.members).map(([member, m]) => ({ flat: flatName(name, member), s: m, of: { object: s, member } }))
})

/** The component of an object setting in the OpenAPI document (RetryPolicy, BatchSettings). */
const componentName = (object: ObjectSetting) => (object.component as { $id?: string }).$id!

/**
 * Whether a description names `value` as the default: one of its clauses ("; "-separated) holds the
 * word "default" and the value ("none" or "null" for null), as in "default 30000",
 * "explicit (default): …", "default min(10000, ackTimeoutMs), …", "null: … (the default)".
 */
function namesDefault(description: string | undefined, value: unknown): boolean {
  const words = value === null ? ['none', 'null'] : [typeof value === 'string' ? value : JSON.stringify(value)]
  return (description ?? '')
    .split('; ')
    .some(
      (clause) =>
        /\bdefault\b/.test(clause) && words.some((w) => new RegExp(`(^|[^\\w.])${w.replace('.', '\\.')}($|[^\\w.])`).test(clause)),
    )
}

interface JsonSchema {
  description?: string
  properties?: Record<string, JsonSchema>
  required?: string[]
  anyOf?: JsonSchema[]
  $ref?: string
}

t.test('every setting is in the OpenAPI document, its default in its description', async (t) => {
  const doc = JSON.parse(await readFile(new URL('../../openapi/openapi.json', import.meta.url), 'utf8'))
  const schemas = doc.components.schemas as Record<string, JsonSchema>
  const config = schemas.GroupConfig!
  const view = schemas.Group!
  t.same(
    Object.keys(config.properties!).sort(),
    ['topic', ...settings.map(([name]) => name)].sort(),
    'GroupConfig: the topic and the settings',
  )
  t.same(
    Object.keys(view.properties!).sort(),
    ['name', 'topic', 'createdAt', 'updatedAt', ...settings.map(([name]) => name)].sort(),
    'Group: name, topic, timestamps and the settings',
  )
  t.same([...view.required!].sort(), Object.keys(view.properties!).sort(), 'the view reports every setting')
  t.same(
    Object.keys(schemas.GroupStatus!.properties!).filter((p) => !['partitions', 'consumers'].includes(p)),
    Object.keys(view.properties!),
  )

  for (const { flat, s, of } of values) {
    const component = of && schemas[componentName(of.object)]!
    const member = of ? component!.properties![of.member] : config.properties![flat]
    t.ok(member, `${flat} is in the request schema`)
    if (s.default === undefined) t.ok(component?.required?.includes(of!.member), `${flat} has no default: it is required`)
    else
      t.ok(namesDefault(member?.description, s.default), `${flat}: "${member?.description}" names its default ${JSON.stringify(s.default)}`)
  }
  for (const [name, s] of settings) {
    if (s.kind === 'object' && s.nullable !== undefined) {
      t.ok(
        namesDefault(config.properties![name]!.description, null),
        `${name}: "${config.properties![name]!.description}" says null is its default`,
      )
    }
    if (s.kind === 'alias') t.match(config.properties![name]!.description, s.of, `${name} says which setting it spells`)
  }
})

/** The options of `hookq groups <command>`, by flag. */
function optionsOf(command: string): Map<string, Option> {
  const groups = buildProgram(registerGroups).commands.find((c) => c.name() === 'groups')!
  const cmd = groups.commands.find((c: Command) => c.name() === command)!
  return new Map(cmd.options.map((o) => [o.long!, o]))
}

const kebab = (name: string) => name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)

t.test('the CLI has flags for every setting, their help naming the defaults', async (t) => {
  for (const command of ['create', 'update']) {
    const options = optionsOf(command)
    for (const { flat, s } of values) {
      const flag = options.get(`--${kebab(flat)}`)
      t.ok(flag, `groups ${command} --${kebab(flat)}`)
      if (s.nullable !== undefined) t.ok(options.get(`--no-${kebab(flat)}`), `groups ${command} --no-${kebab(flat)} (null)`)
      if (s.default === undefined || s.default === null) continue
      if (typeof s.default === 'boolean') {
        const on = options.get(`--${s.default ? '' : 'no-'}${kebab(flat)}`)
        t.match(on?.description, '(the default)', `--${s.default ? '' : 'no-'}${kebab(flat)} is the default`)
      } else {
        t.ok(namesDefault(flag?.description, s.default), `--${kebab(flat)}: "${flag?.description}" names its default`)
      }
    }
    for (const [name, s] of settings) {
      if (s.kind === 'object' && s.nullable !== undefined) {
        t.match(options.get(`--no-${kebab(name)}`)?.description, '(the default)', `groups ${command} --no-${kebab(name)}`)
      }
      if (s.kind === 'alias')
        t.ok(options.get(`--${kebab(name)}`) && options.get(`--no-${kebab(name)}`), `groups ${command} --[no-]${kebab(name)}`)
    }
  }
})

t.test('every setting has its column, named by its flat name', async (t) => {
  // Columns that are not settings: identity, the topic, timestamps, and pushTimeoutSet (whether
  // pushTimeoutMs was set, or still follows ackTimeoutMs: a rule, kept out of the table).
  const others = ['id', 'name', 'topic', 'createdAt', 'updatedAt', 'pushTimeoutSet']
  t.same(Object.values(Prisma.ConsumerGroupScalarFieldEnum).sort(), [...others, ...values.map((v) => v.flat)].sort())
})

t.test('a group created with no settings reports every default of the table', async (t) => {
  const broker = await startBroker(t)
  const call = async (method: 'GET' | 'PUT', url: string, payload?: object) => {
    const res = await broker.app.inject({ method, url, ...(payload ? { payload } : {}) })
    return { status: res.statusCode, body: res.json() }
  }
  t.equal((await call('PUT', '/v1/topics/plain', { partitions: 1 })).status, 201)
  const created = await call('PUT', '/v1/groups/defaults', { topic: 'plain' })
  t.equal(created.status, 201)
  const read = await call('GET', '/v1/groups/defaults')
  for (const group of [created.body, read.body]) {
    for (const [name, s] of settings) {
      if (s.kind === 'value') t.same(group[name], s.default, `${name}: ${JSON.stringify(s.default)}`)
      else if (s.kind === 'object' && s.nullable !== undefined) t.equal(group[name], null, `${name}: off`)
      else if (s.kind === 'object')
        t.same(group[name], Object.fromEntries(Object.entries(s.members).map(([m, ms]) => [m, ms.default])), name)
      // The alias reports the setting it spells: ordered is true exactly when ordering is "partition".
      else t.equal(group[name], group[s.of] === 'partition', `${name} agrees with ${s.of}`)
    }
  }
  // pushTimeoutMs's default is min(10000, ackTimeoutMs): with the default ackTimeoutMs, the table's.
  t.ok(GROUP_SETTINGS.ackTimeoutMs.default >= GROUP_SETTINGS.pushTimeoutMs.default, 'the defaults leave pushTimeoutMs its own default')
})

/**
 * Every setting of a consumer group in one table, GROUP_SETTINGS: its schema (with its bounds), its
 * default, what it means, and how the CLI spells it where its name and schema do not say it. From
 * the table come
 *  - the PUT body and the group view: GroupConfig, Group and the components RetryPolicy and
 *    BatchSettings, each member described with its default, and through Static<> their types
 *    GroupInput and GroupView;
 *  - a new group's defaults and the mapping to and from its row (src/service/groups.ts): a
 *    setting's column is its name, an object member's is the object's name and the member's
 *    (retry.jitter → retryJitter; see flatName);
 *  - the CLI's flags, their parsers and their help (src/cli/groups.ts).
 * A new setting is one entry here; besides it, only its column in prisma/schema.prisma (with a
 * migration), the code that acts on it, and the README's table of settings.
 *
 * Not in the table, because they are rules rather than data (they stay code in src/service/groups.ts):
 *  - pushTimeoutMs follows ackTimeoutMs until set: its default depends on another setting, and the
 *    row remembers whether the caller set it (pushTimeoutSet);
 *  - `ordered` is the v1 spelling of `ordering`: listed here (an alias, with no column of its own)
 *    so the schemas and the CLI have it, but the two spellings are reconciled in code;
 *  - checks across settings (pushTimeoutMs ≤ ackTimeoutMs, initialDelayMs ≤ maxDelayMs, a batch
 *    needs pushFormat "envelope", the filter's grammar) and the forms of startAt;
 *  - `topic`, which is not a setting: required in every PUT, fixed once the group is created.
 *
 * A leaf (TypeBox and src/core/json-schema.ts only), so the HTTP schemas, the service and the CLI can
 * all import it.
 */
import { Type, type Static, type TNull, type TObject, type TOptional, type TSchema, type TUnion } from 'typebox'
import { NAME_PATTERN, ref } from './json-schema.ts'

/** How the CLI spells a setting where its name and schema do not say it (src/cli/groups.ts). */
export interface CliSpelling {
  /** The value's placeholder; otherwise ms for a …Ms name, n for an integer, x for a number, or the name's last word. */
  arg?: string
  /** A boolean's two flags: what --name and --no-name do. */
  on?: string
  off?: string
  /** Added to the flag's help (an example, a caution). */
  note?: string
}

/** A setting given as one JSON value, or a member of an object setting. */
export interface ValueSetting<I extends TSchema = TSchema, V extends TSchema = TSchema> {
  kind: 'value'
  /** A value the caller may give (not null), with its bounds. */
  schema: TSchema
  /**
   * What a group that never set it has. null: none (the view says null); undefined: no default, the
   * caller must give it (a batch's maxMessages).
   */
  default: unknown
  /** What it is: a clause starting with a capital. Absent when `choices` say it. */
  doc?: string
  /** For a union of literals: what each one means (descriptions mark the default). */
  choices?: Record<string, string>
  /** The default as descriptions put it, from the formatted value (pushTimeoutMs: min(10000, ackTimeoutMs)). */
  defaultPhrase?: (value: string) => string
  /** The caller may send null: what that does. */
  nullable?: string
  /** Stored as its JSON text (the filter's column is text). */
  json?: boolean
  cli?: CliSpelling
  /** Its member of the PUT body: described, optional unless required, with null if nullable. */
  input: I
  /** Its member of the view: no bounds; null too when its default is null. */
  view: V
}

/** A setting given as a JSON object of value settings (retry, batch). */
export interface ObjectSetting<
  M extends Record<string, ValueSetting> = Record<string, ValueSetting>,
  I extends TSchema = TSchema,
  V extends TSchema = TSchema,
> {
  kind: 'object'
  members: M
  /** Its request schema, a named component (RetryPolicy, BatchSettings). */
  component: TObject
  /** A short name: the CLI's help, and the description of a nullable one. */
  label: string
  /**
   * 'by member': a PUT naming some members keeps the others (retry). 'whole': a PUT gives the whole
   * object, and members it leaves out take their defaults, not their previous values (batch).
   */
  given: 'by member' | 'whole'
  /** The caller may send null, which turns it off (what that means); it is off (null) until given. */
  nullable?: string
  /** The member that must be given, whose column says whether a nullable object is on. */
  key?: string
  input: I
  view: V
}

/** Another spelling of a setting (`ordered` for `ordering`): in the schemas and the CLI, with no column. */
export interface AliasSetting<I extends TSchema = TSchema, V extends TSchema = TSchema> {
  kind: 'alias'
  of: string
  schema: TSchema
  doc: string
  cli: CliSpelling
  input: I
  view: V
}

export type Setting = ValueSetting | ObjectSetting | AliasSetting

type Inputs<T extends Record<string, { input: TSchema }>> = { [K in keyof T]: T[K]['input'] }
type Views<T extends Record<string, { view: TSchema }>> = { [K in keyof T]: T[K]['view'] }

function inputsOf<T extends Record<string, { input: TSchema }>>(settings: T): Inputs<T> {
  return Object.fromEntries(Object.entries(settings).map(([name, s]) => [name, s.input])) as Inputs<T>
}

function viewsOf<T extends Record<string, { view: TSchema }>>(settings: T): Views<T> {
  return Object.fromEntries(Object.entries(settings).map(([name, s]) => [name, s.view])) as Views<T>
}

/** A named schema (one with an $id) as a reference to its component; any other as it is. */
function named<S extends TSchema>(schema: S): S {
  return '$id' in schema ? ref(schema) : schema
}

/** The schema without its bounds and descriptions, for the view (answers are not validated). */
function plain<S extends TSchema>(schema: S): S {
  if ('$id' in schema) return ref(schema)
  const s = schema as TSchema
  let out: TSchema
  if (Type.IsUnion(s)) out = Type.Union(s.anyOf.map(plain))
  else if (Type.IsLiteral(s)) out = Type.Literal(s.const)
  else if (Type.IsInteger(s)) out = Type.Integer()
  else if (Type.IsNumber(s)) out = Type.Number()
  else if (Type.IsString(s)) out = Type.String()
  else if (Type.IsBoolean(s)) out = Type.Boolean()
  else throw new Error(`group-settings: no plain form for ${JSON.stringify(schema)}`)
  return out as S
}

/** A setting's default as descriptions and help put it: "none" for null, strings quoted. */
function defaultText(s: ValueSetting): string {
  if (s.default === null) return 'none'
  const value = typeof s.default === 'string' ? JSON.stringify(s.default) : String(s.default)
  return s.defaultPhrase ? s.defaultPhrase(value) : value
}

/** "explicit (default): a 2xx means received; auto: a 2xx is the ack". */
function choiceList(s: ValueSetting): string {
  return Object.entries(s.choices ?? {})
    .map(([choice, meaning]) => `${choice}${choice === s.default ? ' (default)' : ''}: ${meaning}`)
    .join('; ')
}

/**
 * A value setting's description: what it is (or its choices) and its default; with `withNull`, then
 * what null does. The PUT body's member says all of it; a CLI flag says the first part, and its
 * --no- flag the null part.
 */
export function description(s: Omit<ValueSetting, 'input' | 'view'>, withNull = true): string {
  if (s.doc === undefined && !s.choices) throw new Error('group-settings: a setting needs doc or choices')
  const parts = [s.choices ? choiceList(s as ValueSetting) : s.doc]
  const defaultSaidByNull = s.default === null && s.nullable !== undefined
  if (s.default !== undefined && !s.choices && !defaultSaidByNull) parts.push(`default ${defaultText(s as ValueSetting)}`)
  if (withNull && s.nullable !== undefined) parts.push(`null: ${whatNullDoes(s)}`)
  return parts.join('; ')
}

/** What sending null does, marked when it is the default: "every message is pushed (the default)". */
export function whatNullDoes(s: Pick<ValueSetting, 'nullable' | 'default'>): string {
  return `${s.nullable}${s.default === null ? ' (the default)' : ''}`
}

interface ValueSpec<S extends TSchema, D, N> {
  default: D
  doc?: string
  choices?: Record<Extract<Static<S>, string>, string>
  defaultPhrase?: (value: string) => string
  nullable?: N
  json?: boolean
  cli?: CliSpelling
}

/**
 * A value setting: `schema` is what the caller may give (not null), with its bounds. The return type
 * says which schemas the setting adds to the PUT body and the view (so Static<> of them is exact);
 * TypeScript cannot check a body against such conditional types, hence the casts of these helpers.
 */
function value<S extends TSchema, const D extends Static<S> | null, N extends string | undefined = undefined>(
  schema: S,
  spec: ValueSpec<S, D, N>,
): ValueSetting<N extends string ? TOptional<TUnion<[S, TNull]>> : TOptional<S>, null extends D ? TUnion<[S, TNull]> : S> & { default: D } {
  const s = { kind: 'value' as const, schema, ...spec }
  const described = { description: description(s) }
  const given = named(schema)
  const input =
    spec.nullable === undefined ? Type.Optional(Type.With(given, described)) : Type.Optional(Type.Union([given, Type.Null()], described))
  const view = spec.default === null ? Type.Union([plain(schema), Type.Null()]) : plain(schema)
  return { ...s, input, view } as never
}

/** A member of an object setting that the caller must give whenever they give the object (no default). */
function required<S extends TSchema>(schema: S, spec: { doc: string; cli?: CliSpelling }): ValueSetting<S, S> {
  const s = { kind: 'value' as const, schema, default: undefined, ...spec }
  return { ...s, input: Type.With(schema, { description: description(s) }), view: plain(schema) } as never
}

interface ObjectSpec<N> {
  /** The component's name in the OpenAPI document. */
  $id: string
  label: string
  /** The component's description. */
  doc: string
  given: 'by member' | 'whole'
  nullable?: N
}

/** An object setting of `members`; its request schema is the component `spec.$id`. */
function object<M extends Record<string, ValueSetting>, N extends string | undefined = undefined>(
  members: M,
  spec: ObjectSpec<N>,
): ObjectSetting<
  M,
  N extends string ? TOptional<TUnion<[TObject<Inputs<M>>, TNull]>> : TOptional<TObject<Inputs<M>>>,
  N extends string ? TUnion<[TObject<Views<M>>, TNull]> : TObject<Views<M>>
> {
  const component = Type.Object(inputsOf(members), { $id: spec.$id, additionalProperties: false, description: spec.doc })
  const view = Type.Object(viewsOf(members))
  const keys = Object.keys(members).filter((m) => members[m]!.default === undefined)
  if (spec.nullable !== undefined && keys.length !== 1) throw new Error(`group-settings: ${spec.$id} needs exactly one required member`)
  if (spec.nullable === undefined) {
    return { kind: 'object', members, component, label: spec.label, given: spec.given, input: Type.Optional(ref(component)), view } as never
  }
  const summary = [spec.label, ...(spec.given === 'whole' ? ['given whole (what it leaves out takes its default)'] : [])]
    .concat(`null: ${whatNullDoes({ nullable: spec.nullable, default: null })}`)
    .join('; ')
  return {
    kind: 'object',
    members,
    component,
    label: spec.label,
    given: spec.given,
    nullable: spec.nullable,
    key: keys[0],
    input: Type.Optional(Type.Union([ref(component), Type.Null()], { description: summary })),
    view: Type.Union([view, Type.Null()]),
  } as never
}

/** Another spelling of the setting `of`; `viewDoc` describes it in the view. */
function alias<S extends TSchema>(
  schema: S,
  spec: { of: string; doc: string; viewDoc: string; cli: CliSpelling },
): AliasSetting<TOptional<S>, S> {
  return {
    kind: 'alias',
    of: spec.of,
    schema,
    doc: spec.doc,
    cli: spec.cli,
    input: Type.Optional(Type.With(schema, { description: spec.doc })),
    view: Type.With(plain(schema), { description: spec.viewDoc }),
  } as never
}

// The filter's grammar is checked by the service (src/core/filter.ts), which names the member at
// fault; the schema says only that it is an object, and describes it for the OpenAPI reader.
export const Filter = Type.Record(Type.String(), Type.Unknown(), {
  $id: 'Filter',
  description:
    'Members that must all match (AND): "key", "headers.<name>" or "value.<a.b.c>" (a path into a JSON object value), ' +
    'each with a condition: a string, number, boolean or null (equal), an array of them (any), {"prefix": "eu-"}, {"exists": true|false}, ' +
    '{"gt"|"gte"|"lt"|"lte": n} (several form a range) or {"not": <condition>}; and "$or": [<filter>, ...], matching when any does. ' +
    'A path that does not exist matches only {"exists": false}.',
  examples: [
    {
      'headers.type': ['order.created', 'order.paid'],
      'value.region': { prefix: 'eu-' },
      $or: [{ 'value.total': { gte: 100 } }, { key: 'vip' }],
    },
  ],
})

/**
 * The settings, in the order the schemas list them. No `default` keywords go into the request
 * schemas: Ajv would fill omitted fields in, and a PUT updating an existing group would then reset
 * every setting it did not mention. Defaults are applied by the service on creation, and named in
 * the descriptions.
 */
export const GROUP_SETTINGS = {
  delivery: value(Type.Union([Type.Literal('push'), Type.Literal('pull')]), {
    default: 'push',
    choices: {
      push: "messages are pushed to the group's consumers",
      pull: 'callers take messages with POST /v1/groups/{group}/pull; the group has no consumers',
    },
  }),
  ackMode: value(Type.Union([Type.Literal('explicit'), Type.Literal('auto')]), {
    default: 'explicit',
    choices: { explicit: 'a 2xx means received, ack over HTTP', auto: 'a 2xx is the ack' },
  }),
  ackTimeoutMs: value(Type.Integer({ minimum: 1000, maximum: 43_200_000 }), {
    default: 30_000,
    doc: 'Time to ack a push (explicit mode) before it is pushed again',
  }),
  maxDeliveries: value(Type.Integer({ minimum: 1, maximum: 1000 }), { default: 5, doc: 'Attempts before dead-lettering' }),
  retry: object(
    {
      initialDelayMs: value(Type.Integer({ minimum: 0, maximum: 86_400_000 }), { default: 1000, doc: 'Delay before the second attempt' }),
      multiplier: value(Type.Number({ minimum: 1, maximum: 100 }), { default: 2, doc: 'Each further delay is this many times the last' }),
      maxDelayMs: value(Type.Integer({ minimum: 0, maximum: 86_400_000 }), { default: 60_000, doc: 'The longest delay' }),
      jitter: value(Type.Number({ minimum: 0, maximum: 1 }), {
        default: 0.1,
        doc: 'Spread of each delay, as a fraction: 0.1 is ±10%',
        cli: { arg: 'fraction' },
      }),
    },
    {
      $id: 'RetryPolicy',
      label: 'Retry',
      doc: 'Delay before attempt n+1: min(maxDelayMs, initialDelayMs × multiplier^(n-1)), ±jitter',
      given: 'by member',
    },
  ),
  deadLetterTopic: value(Type.String({ pattern: NAME_PATTERN }), {
    default: null,
    doc: 'The topic dead letters are produced to (it must exist)',
    nullable: 'dead letters are only recorded as dead',
    cli: { arg: 'topic' },
  }),
  startAt: value(Type.String(), {
    default: 'earliest',
    doc: 'Where a new group starts: "earliest", "latest", or an RFC 3339 date-time (2026-01-01T00:00:00Z)',
    cli: { arg: 'where' },
  }),
  maxInFlight: value(Type.Integer({ minimum: 1, maximum: 10_000 }), { default: 100, doc: 'Messages in flight on one partition at most' }),
  ordered: alias(Type.Boolean(), {
    of: 'ordering',
    doc: 'The v1 spelling of ordering: true is "partition", false "none"',
    viewDoc: 'true exactly when ordering is "partition"',
    cli: { on: 'the same as --ordering partition', off: 'the same as --ordering none' },
  }),
  ordering: value(Type.Union([Type.Literal('none'), Type.Literal('partition'), Type.Literal('key')]), {
    default: 'none',
    choices: {
      none: 'messages of a partition in parallel up to maxInFlight',
      partition: 'one message of a partition outstanding at a time',
      key: 'one message per key outstanding at a time, keys in parallel (a message without a key is not ordered)',
    },
  }),
  pushTimeoutMs: value(Type.Integer({ minimum: 100, maximum: 600_000 }), {
    default: 10_000,
    doc: 'Time a push may take to be answered',
    defaultPhrase: (value) => `min(${value}, ackTimeoutMs), following ackTimeoutMs until set`,
    nullable: 'back to the default',
  }),
  pushFormat: value(Type.Union([Type.Literal('envelope'), Type.Literal('raw')]), {
    default: 'envelope',
    choices: {
      envelope: 'the message in a JSON envelope (deliveryId, value, attempt, ackDeadline, ...)',
      raw: "the message value itself as the body, the envelope's other fields in hookq-* headers",
    },
  }),
  paused: value(Type.Boolean(), {
    default: false,
    doc: 'true stops new pushes; acks still count',
    cli: { on: 'stop new pushes (acks still count)', off: 'push' },
  }),
  batch: object(
    {
      maxMessages: required(Type.Integer({ minimum: 1, maximum: 1000 }), {
        doc: 'Messages a push carries at most',
        cli: { note: 'the batch is given whole: set its other flags with it' },
      }),
      maxWaitMs: value(Type.Integer({ minimum: 0, maximum: 10_000 }), {
        default: 0,
        doc: 'How long a batch waits for more messages after its first is ready',
        defaultPhrase: (value) => `${value} (the messages ready together)`,
      }),
      maxBytes: value(Type.Integer({ minimum: 1024, maximum: 16 * 1024 * 1024 }), {
        default: null,
        doc: 'A batch is sent before its body would pass this size (a single message larger than it goes alone)',
      }),
    },
    {
      $id: 'BatchSettings',
      label: 'Batch push',
      doc: 'One push carries up to maxMessages messages of a partition as {"deliveries": [<envelope>, ...]}; needs pushFormat "envelope"',
      given: 'whole',
      nullable: 'one message a push',
    },
  ),
  filter: value(Filter, {
    default: null,
    doc: 'Only matching messages are pushed; the others are completed without a push',
    nullable: 'every message is pushed',
    json: true,
    cli: { arg: 'json', note: 'e.g. \'{"headers.type":"paid"}\'' },
  }),
} satisfies Record<string, Setting>

/**
 * A setting's flat name: its own, or for an object's member the object's name and the member's
 * (retry.jitter → retryJitter). It names the setting's column in consumer_groups and the attribute
 * of its CLI flag (--retry-jitter).
 */
export function flatName(name: string, member?: string): string {
  return member === undefined ? name : `${name}${member[0]!.toUpperCase()}${member.slice(1)}`
}

export const RetryPolicy = GROUP_SETTINGS.retry.component
export const BatchSettings = GROUP_SETTINGS.batch.component

/** The PUT body: the topic, and any of the settings. */
export const GroupConfig = Type.Object(
  {
    topic: Type.String({ pattern: NAME_PATTERN, description: 'The topic consumed; fixed once created' }),
    ...inputsOf(GROUP_SETTINGS),
  },
  { $id: 'GroupConfig', additionalProperties: false },
)

/** A group as the API shows it: every setting, defaults resolved. */
export const Group = Type.Object(
  {
    name: Type.String(),
    topic: Type.String(),
    ...viewsOf(GROUP_SETTINGS),
    createdAt: Type.String({ format: 'date-time' }),
    updatedAt: Type.String({ format: 'date-time' }),
  },
  { $id: 'Group' },
)

/** A PUT body: every setting optional but the topic. */
export type GroupInput = Static<typeof GroupConfig>
/** A group as the API shows it. */
export type GroupView = Static<typeof Group>

/**
 * `hookq keys create|list|delete`: API keys scoped to topics and groups (needs an admin key without
 * patterns). A key is printed once, by `create`, the only time the broker has it; `list` shows ids,
 * names and scopes, never a key.
 */
import { InvalidArgumentError, type Command } from 'commander'
import { unwrap, type Key, type KeyScope } from '@hookq/client'
import { describeScope, scopesError, type Action, ACTIONS } from '../security/access.ts'
import { timestamp } from './args.ts'
import { contextOf } from './context.ts'
import { note, printJson, printLine, printTable } from './output.ts'

/**
 * One `--scope` value: `action`, then `:topics=a,b` and/or `:groups=c,d`, e.g. `produce:topics=orders.*`
 * or `admin:topics=orders*:groups=billing`. Collected into a list (the option repeats).
 */
export function scopeSpec(text: string, previous: KeyScope[] = []): KeyScope[] {
  const [action, ...parts] = text.trim().split(':')
  if (!(ACTIONS as readonly string[]).includes(action ?? '')) {
    throw new InvalidArgumentError(`expected ${ACTIONS.join(', ')}, then :topics=a,b and/or :groups=c,d`)
  }
  const scope: KeyScope = { action: action as Action }
  for (const part of parts) {
    const m = /^(topics|groups)=(.+)$/.exec(part)
    if (!m || scope[m[1] as 'topics' | 'groups'])
      throw new InvalidArgumentError(`expected :topics=a,b or :groups=c,d once each, got ${JSON.stringify(part)}`)
    scope[m[1] as 'topics' | 'groups'] = m[2]!.split(',').map((p) => p.trim())
  }
  const problem = scopesError([scope])
  if (problem) throw new InvalidArgumentError(problem.replace(/^scopes\[0\]\.?/, '').replace(/^: /, ''))
  return [...previous, scope]
}

const scopesText = (scopes: KeyScope[]) => scopes.map((s) => describeScope(s)).join(' ')

/** Adds the `keys` command group to `program`. */
export function registerKeys(program: Command): void {
  const keys = program.command('keys').description('API keys scoped to topics and groups (needs an admin key without patterns)')

  keys
    .command('create <name>')
    .description('make a key; it is printed this once and never again')
    .requiredOption(
      '-s, --scope <spec>',
      'action[:topics=p1,p2][:groups=p1,p2], repeatable; action is produce, consume, admin or metrics; a pattern is a name or a prefix ending in *',
      scopeSpec,
    )
    .option('--expires-at <time>', 'ISO-8601 time after which the key gets 401', timestamp)
    .action(async (name: string, opts: { scope: KeyScope[]; expiresAt?: string }, cmd: Command) => {
      const ctx = contextOf(cmd)
      const made = await unwrap(
        ctx.client.POST('/v1/keys', {
          body: { name, scopes: opts.scope, ...(opts.expiresAt === undefined ? {} : { expiresAt: opts.expiresAt }) },
        }),
      )
      if (ctx.json) return printJson(made)
      printLine(made.key)
      note(`hookq: created key ${made.id} (${made.name}): ${scopesText(made.scopes)}${made.expiresAt ? `, expires ${made.expiresAt}` : ''}`)
      note('hookq: the key above is shown this once: store it now (the broker keeps only its hash)')
    })

  keys
    .command('list')
    .alias('ls')
    .description('list keys: ids, names, scopes, expiry (never the keys)')
    .action(async (_opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { keys: list } = await unwrap(ctx.client.GET('/v1/keys'))
      if (ctx.json) return printJson({ keys: list })
      printTable(
        ['id', 'name', 'scopes', 'created', 'expires'],
        list.map((k: Key) => [k.id, k.name, scopesText(k.scopes), k.createdAt, k.expiresAt ?? '-']),
      )
    })

  keys
    .command('delete <id>')
    .alias('rm')
    .description('delete a key: every broker process refuses it within 2 s')
    .action(async (id: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/keys/{id}', { params: { path: { id } } }))
      if (ctx.json) return printJson({ deleted: id })
      printLine(`deleted: key ${id}`)
    })
}

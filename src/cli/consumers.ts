/** `hookq consumers add|list|update|remove`: the webhook endpoints of a group. */
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import { unwrap } from '@hookq/client'
import { decodeSecret, generateSecret, SECRET_MAX_BYTES, SECRET_MIN_BYTES, SECRET_PREFIX } from '../core/signature.ts'
import { contextOf } from './context.ts'
import { CliError, EXIT, printJson, printLine, printTable, short } from './output.ts'

/** Adds the `consumers` command group to `program`. */
export function registerConsumers(program: Command): void {
  const consumers = program.command('consumers').description("add, list and remove a group's webhook consumers")

  consumers
    .command('add <group> <url>')
    .description("register a webhook endpoint; the group's partitions are rebalanced over its consumers")
    .option(
      '--secret <whsec|generate>',
      "Standard Webhooks secret (whsec_ + base64) to sign pushes with; 'generate' makes one and prints it",
    )
    .option('--rate-limit <n>', 'at most n pushes start in any one second', Number)
    .option('--max-concurrency <n>', 'at most n pushes in flight at once', Number)
    .option('--auth-file <path>', AUTH_FILE_HELP)
    .action(
      async (
        group: string,
        url: string,
        opts: { secret?: string; rateLimit?: number; maxConcurrency?: number; authFile?: string },
        cmd: Command,
      ) => {
        const ctx = contextOf(cmd)
        const generated = opts.secret === 'generate' ? generateSecret() : undefined
        const secret = generated ?? (opts.secret === undefined ? undefined : checkedSecret(opts.secret))
        const auth = opts.authFile === undefined ? undefined : readAuth(opts.authFile)
        const consumer = await unwrap(
          ctx.client.POST('/v1/groups/{group}/consumers', {
            params: { path: { group } },
            body: {
              url,
              ...(secret === undefined ? {} : { secret }),
              ...(auth === undefined ? {} : { auth: auth as never }),
              ...(opts.rateLimit === undefined ? {} : { rateLimitPerSecond: opts.rateLimit }),
              ...(opts.maxConcurrency === undefined ? {} : { maxConcurrency: opts.maxConcurrency }),
            },
          }),
        )
        // A generated secret is shown once, here: the user asked for it, and the broker never shows it again.
        if (ctx.json) return printJson(generated === undefined ? consumer : { ...consumer, secret: generated })
        printLine(
          `added: consumer ${consumer.id} of group ${group} → ${consumer.url}${consumer.hasSecret === true ? ' (signed)' : ''}${consumer.auth ? ` (auth: ${authText(consumer.auth)})` : ''}`,
        )
        if (generated !== undefined) {
          printLine(`secret: ${generated}`)
          printLine('(shown only now: give it to the consumer, e.g. as HOOKQ_WEBHOOK_SECRET; the broker never shows it again)')
        }
      },
    )

  consumers
    .command('list <group>')
    .alias('ls')
    .description("list a group's consumers")
    .action(async (group: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { consumers: list } = await unwrap(ctx.client.GET('/v1/groups/{group}/consumers', { params: { path: { group } } }))
      if (ctx.json) return printJson({ consumers: list })
      printTable(
        ['id', 'url', 'signed', 'auth', 'limits', 'state', 'created'],
        list.map((c) => [
          c.id,
          c.url,
          c.hasSecret === true ? 'yes' : 'no',
          c.auth ? authText(c.auth) : '-',
          limitsText(c),
          c.disabled === true ? `disabled: ${short(c.disabledReason ?? '410 Gone', 40)}` : 'active',
          c.createdAt,
        ]),
      )
    })

  consumers
    .command('update <group> <id>')
    .description("change a consumer's url or limits in place; its partitions stay")
    .option('--endpoint <url>', 'push to this url from now on (--url names the broker)')
    .option('--rate-limit <n>', "at most n pushes start in any one second ('none' removes the limit)", limitArg)
    .option('--max-concurrency <n>', "at most n pushes in flight at once ('none' removes the cap)", limitArg)
    .option('--auth-file <path>', `${AUTH_FILE_HELP}; the file may hold null to remove it`)
    .action(
      async (
        group: string,
        id: string,
        opts: { endpoint?: string; rateLimit?: Limit; maxConcurrency?: Limit; authFile?: string },
        cmd: Command,
      ) => {
        const ctx = contextOf(cmd)
        const auth = opts.authFile === undefined ? undefined : readAuth(opts.authFile)
        const consumer = await unwrap(
          ctx.client.PATCH('/v1/groups/{group}/consumers/{id}', {
            params: { path: { group, id } },
            body: {
              ...(opts.endpoint === undefined ? {} : { url: opts.endpoint }),
              ...(opts.rateLimit === undefined ? {} : { rateLimitPerSecond: opts.rateLimit === 'none' ? null : opts.rateLimit }),
              ...(opts.maxConcurrency === undefined ? {} : { maxConcurrency: opts.maxConcurrency === 'none' ? null : opts.maxConcurrency }),
              ...(auth === undefined ? {} : { auth: auth as never }),
            },
          }),
        )
        if (ctx.json) return printJson(consumer)
        printLine(
          `updated: consumer ${consumer.id} of group ${group} → ${consumer.url} (${limitsText(consumer)}${consumer.auth ? `; auth: ${authText(consumer.auth)}` : ''})`,
        )
      },
    )

  consumers
    .command('remove <group> <id>')
    .alias('rm')
    .description('remove a consumer; its partitions move to the others')
    .action(async (group: string, id: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/groups/{group}/consumers/{id}', { params: { path: { group, id } } }))
      if (ctx.json) return printJson({ removed: id, group })
      printLine(`removed: consumer ${id} of group ${group}`)
    })
}

const AUTH_FILE_HELP =
  'push authentication as JSON, from a file or - for stdin (not the command line: it holds secret values), e.g. {"type":"jwt"}, ' +
  '{"type":"headers","headers":{"x-api-key":"..."}}, {"type":"oauth2","tokenUrl":"...","clientId":"...","clientSecret":"..."}'

/** The JSON of --auth-file: read, parsed, passed on for the broker to check. Its content is never printed. */
function readAuth(path: string): unknown {
  let text: string
  try {
    text = readFileSync(path === '-' ? 0 : path, 'utf8')
  } catch (err) {
    throw new CliError(`--auth-file: cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`, EXIT.usage)
  }
  try {
    return JSON.parse(text)
  } catch {
    throw new CliError(`--auth-file: ${path} is not JSON`, EXIT.usage)
  }
}

/** A consumer's auth as the broker shows it: the type and header names or client id, never a value. */
function authText(
  auth:
    | { type: 'headers'; headerNames: string[] }
    | { type: 'jwt'; audience: string | null }
    | { type: 'oauth2'; tokenUrl: string; clientId: string; scope: string | null },
): string {
  if (auth.type === 'headers') return `headers ${auth.headerNames.join(', ')}`
  if (auth.type === 'jwt') return auth.audience === null ? 'jwt' : `jwt (aud ${auth.audience})`
  return `oauth2 ${auth.clientId} @ ${short(auth.tokenUrl, 60)}`
}

/**
 * A --secret the broker will take (whsec_ and the base64 of 24 to 64 bytes), checked before the
 * call so that the error can say how to make one; the value itself is never printed.
 */
function checkedSecret(secret: string): string {
  let ok = secret.startsWith(SECRET_PREFIX)
  try {
    decodeSecret(secret)
  } catch {
    ok = false
  }
  if (!ok) {
    throw new CliError(
      `--secret must be ${SECRET_PREFIX} followed by the base64 of ${SECRET_MIN_BYTES} to ${SECRET_MAX_BYTES} random bytes; ` +
        '`--secret generate` makes one and prints it once (or: openssl rand -base64 32, with whsec_ in front)',
      EXIT.usage,
    )
  }
  return secret
}

/** A limit flag's value: a number, or `none` to remove the limit (commander turns a null from a parser into ''). */
type Limit = number | 'none'
function limitArg(value: string): Limit {
  return value === 'none' ? 'none' : Number(value)
}

function limitsText(c: { rateLimitPerSecond: number | null; maxConcurrency: number | null }): string {
  const parts = [
    c.rateLimitPerSecond === null ? '' : `${c.rateLimitPerSecond}/s`,
    c.maxConcurrency === null ? '' : `≤${c.maxConcurrency} at once`,
  ]
  return parts.filter(Boolean).join(', ') || '-'
}

/** `hookq consumers add|list|remove`: the webhook endpoints of a group. */
import type { Command } from 'commander'
import { unwrap } from '@hookq/client'
import { contextOf } from './context.ts'
import { printJson, printLine, printTable, short } from './output.ts'

/** Adds the `consumers` command group to `program`. */
export function registerConsumers (program: Command): void {
  const consumers = program.command('consumers').description("add, list and remove a group's webhook consumers")

  consumers.command('add <group> <url>')
    .description("register a webhook endpoint; the group's partitions are rebalanced over its consumers")
    .option('--secret <whsec>', 'Standard Webhooks secret (whsec_ + base64) to sign pushes with')
    .action(async (group: string, url: string, opts: { secret?: string }, cmd: Command) => {
      const ctx = contextOf(cmd)
      const consumer = await unwrap(ctx.client.POST('/v1/groups/{group}/consumers', {
        params: { path: { group } }, body: { url, ...(opts.secret === undefined ? {} : { secret: opts.secret }) },
      }))
      if (ctx.json) return printJson(consumer)
      printLine(`added: consumer ${consumer.id} of group ${group} → ${consumer.url}${consumer.hasSecret === true ? ' (signed)' : ''}`)
    })

  consumers.command('list <group>').alias('ls')
    .description("list a group's consumers")
    .action(async (group: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { consumers: list } = await unwrap(ctx.client.GET('/v1/groups/{group}/consumers', { params: { path: { group } } }))
      if (ctx.json) return printJson({ consumers: list })
      printTable(['id', 'url', 'signed', 'state', 'created'], list.map((c) => [
        c.id, c.url, c.hasSecret === true ? 'yes' : 'no', c.disabled === true ? `disabled: ${short(c.disabledReason ?? '410 Gone', 40)}` : 'active', c.createdAt,
      ]))
    })

  consumers.command('remove <group> <id>').alias('rm')
    .description('remove a consumer; its partitions move to the others')
    .action(async (group: string, id: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/groups/{group}/consumers/{id}', { params: { path: { group, id } } }))
      if (ctx.json) return printJson({ removed: id, group })
      printLine(`removed: consumer ${id} of group ${group}`)
    })
}

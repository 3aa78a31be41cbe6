/** `hookq topics create|list|show|delete`. */
import type { Command } from 'commander'
import { unwrap, type Topic } from '@hookq/client'
import { wholeNumber } from './args.ts'
import { contextOf, unwrapWithStatus } from './context.ts'
import { count, printJson, printLine, printTable } from './output.ts'

/** Adds the `topics` command group to `program`. */
export function registerTopics(program: Command): void {
  const topics = program.command('topics').description('create, list, show and delete topics')

  topics
    .command('create <name>')
    .description('create a topic (a topic that exists with the same configuration is fine)')
    .requiredOption('-p, --partitions <n>', 'number of partitions, 1 to 1024', wholeNumber(1, 1024))
    .option('--retention-ms <ms>', 'how long messages and idempotency keys are kept (default 7 days)', wholeNumber(60_000))
    .action(async (name: string, opts: { partitions: number; retentionMs?: number }, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { data: topic, status } = await unwrapWithStatus(
        ctx.client.PUT('/v1/topics/{topic}', {
          params: { path: { topic: name } },
          body: { partitions: opts.partitions, ...(opts.retentionMs === undefined ? {} : { retentionMs: opts.retentionMs }) },
        }),
      )
      if (ctx.json) return printJson(topic)
      printLine(
        `${status === 201 ? 'created' : 'exists'}: topic ${topic.name} with ${count(topic.partitions, 'partition')}, retention ${duration(topic.retentionMs)}`,
      )
    })

  topics
    .command('list')
    .alias('ls')
    .description('list topics')
    .action(async (_opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const { topics: list } = await unwrap(ctx.client.GET('/v1/topics'))
      if (ctx.json) return printJson({ topics: list })
      printTable(
        ['name', 'partitions', 'retention', 'created'],
        list.map((t: Topic) => [t.name, t.partitions, duration(t.retentionMs), t.createdAt]),
      )
    })

  topics
    .command('show <name>')
    .alias('get')
    .description("show a topic and each partition's end offset")
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      const topic = await unwrap(ctx.client.GET('/v1/topics/{topic}', { params: { path: { topic: name } } }))
      if (ctx.json) return printJson(topic)
      printLine(
        `topic ${topic.name}: ${count(topic.partitions, 'partition')}, retention ${duration(topic.retentionMs)}, created ${topic.createdAt}`,
      )
      printTable(
        ['partition', 'end offset'],
        topic.partitionStats.map((s) => [s.partition, s.endOffset]),
      )
    })

  topics
    .command('delete <name>')
    .alias('rm')
    .description("delete a topic with its messages, and its groups' offsets and attempts")
    .action(async (name: string, _opts: object, cmd: Command) => {
      const ctx = contextOf(cmd)
      await unwrap(ctx.client.DELETE('/v1/topics/{topic}', { params: { path: { topic: name } } }))
      if (ctx.json) return printJson({ deleted: name })
      printLine(`deleted: topic ${name}`)
    })
}

/** Milliseconds as the largest whole unit that divides them: 604800000 → 7d. */
export function duration(ms: number): string {
  for (const [unit, size] of [
    ['d', 86_400_000],
    ['h', 3_600_000],
    ['m', 60_000],
    ['s', 1000],
  ] as const) {
    if (ms >= size && ms % size === 0) return `${ms / size}${unit}`
  }
  return `${ms}ms`
}

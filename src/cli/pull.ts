/**
 * `hookq pull <group>`: lease a pull group's messages and print them, one line each (NDJSON, the
 * envelope, with --json). With --ack they are acked once printed (the group's messages are taken);
 * without, they are only leased and come again when their leases pass (a look that costs an
 * attempt each). --wait long-polls for the first message; --follow keeps pulling until Ctrl-C.
 *
 * Ctrl-C never strands a lease: a pull still waiting is cut, and the broker gives back what it
 * leased for it (a caller gone before its answer); an answer already arriving is read to its end
 * (context.ts), printed, and with --ack acked before the CLI exits. Without --ack, printed leases
 * stay leased until their deadline, as they do without Ctrl-C: the contract has no way to give a
 * lease back uncounted (a nack counts an attempt, and dead-letters at maxDeliveries). A second
 * Ctrl-C exits at once, leaving what is unacked to its deadline.
 */
import type { Command } from 'commander'
import { setTimeout as sleep } from 'node:timers/promises'
import { HookqError, unwrap, type components } from '@hookq/client'
import { wholeNumber } from './args.ts'
import { contextOf, type CliContext } from './context.ts'
import { note, printLine, visible, visibleJson } from './output.ts'

type Pulled = components['schemas']['PulledMessage']

interface PullOptions {
  max: number
  wait: number
  lease?: number
  ack?: boolean
  follow?: boolean
}

/** Adds `pull` to `program`. */
export function registerPull(program: Command): void {
  program
    .command('pull <group>')
    .description('lease messages of a pull group and print them; --ack acks them once printed')
    .option('-n, --max <n>', 'messages leased at most (1..1000)', wholeNumber(1, 1000), 10)
    .option('--wait <ms>', 'wait up to this long for the first message (0..20000)', wholeNumber(0, 20_000), 0)
    .option('--lease <ms>', "each lease's length (default the group's ackTimeoutMs)", wholeNumber(1000, 43_200_000))
    .option('--ack', 'ack each message once printed (without it, each comes again when its lease passes)')
    .option('-f, --follow', 'keep pulling (long polls of 20 s unless --wait says) until Ctrl-C')
    .action(async (group: string, opts: PullOptions, cmd: Command) => {
      const stop = new AbortController()
      const onSignal = () => {
        stop.abort()
        note('hookq pull: stopping (an answer already arriving is printed first)')
      }
      process.once('SIGINT', onSignal)
      process.once('SIGTERM', onSignal)
      try {
        await pull(contextOf(cmd, stop.signal), group, opts)
      } catch (err) {
        if (!stop.signal.aborted) throw err // Ctrl-C mid-call is the normal end of a follow
      } finally {
        process.off('SIGINT', onSignal)
        process.off('SIGTERM', onSignal)
      }
    })
}

async function pull(ctx: CliContext, group: string, opts: PullOptions): Promise<void> {
  const params = { path: { group } }
  const waitMs = opts.follow && opts.wait === 0 ? 20_000 : opts.wait
  do {
    const body = { maxMessages: opts.max, waitMs, ...(opts.lease === undefined ? {} : { leaseMs: opts.lease }) }
    let messages: Pulled[]
    try {
      ;({ messages } = await unwrap(ctx.client.POST('/v1/groups/{group}/pull', { params, body, signal: ctx.signal })))
    } catch (err) {
      // A follow outlasts the broker shedding load (429 too many waiting pulls, 503): it asks
      // again when the answer says, as a consumer loop does; a single pull reports it.
      const shed = err instanceof HookqError && (err.status === 429 || err.status === 503)
      if (!opts.follow || !shed) throw err
      const seconds = Math.min(30, Math.max(1, err.retryAfterSeconds ?? 1))
      if (!ctx.json) note(`${err.message}; asking again in ${seconds} s`)
      await sleep(seconds * 1000, undefined, { signal: ctx.signal }).catch(() => {})
      continue
    }
    for (const m of messages) printLine(ctx.json ? visibleJson(JSON.stringify(m)) : lineOf(m))
    if (opts.ack && messages.length > 0) {
      await unwrap(ctx.client.POST('/v1/groups/{group}/acks', { params, body: { deliveryIds: messages.map((m) => m.deliveryId) } }))
    }
    if (!opts.follow && !ctx.json) note(`${messages.length} leased${opts.ack ? ' and acked' : ''}`)
  } while (opts.follow && !ctx.signal?.aborted)
}

function lineOf(m: Pulled): string {
  const key = m.key === null ? '' : ` key=${visible(m.key)}`
  return `${m.partition}/${m.offset} #${m.attempt}${key} ${visible(JSON.stringify(m.value))}  ${m.deliveryId}`
}

/**
 * Produce load, run as its own process by produce.ts so that generating load does not share an
 * event loop with the code that measures the broker. Runs autocannon for warm-up + window, counts
 * only answers that complete inside the window, and prints one JSON line (Measured) on stdout.
 *
 * argv[2]: JSON { url, connections, batch, warmupS, measureS, maxRequests, brokerPid }
 */
import autocannon from 'autocannon'
import { MESSAGE_VALUE } from './lib/payload.ts'
import { Latencies, type Measured } from './lib/stats.ts'
import { MeasureWindow } from './lib/window.ts'

interface Args {
  url: string
  connections: number
  batch: number
  warmupS: number
  measureS: number
  maxRequests: number
  brokerPid: number
}
const args = JSON.parse(process.argv[2] ?? '{}') as Args

// No key and no partition: the broker spreads the messages round robin over the partitions.
const body = JSON.stringify({ messages: Array.from({ length: args.batch }, () => ({ value: MESSAGE_VALUE })) })

const instance = autocannon({
  url: args.url,
  method: 'POST',
  connections: args.connections,
  pipelining: 1,
  // A safety net only: the window timer below stops the run. autocannon checks both once a second.
  duration: args.warmupS + args.measureS + 2,
  timeout: 10,
  headers: { 'content-type': 'application/json' },
  body,
})

const span = new MeasureWindow(args, () => instance.stop())
let ok = 0
let errors = 0
const non201: Record<string, number> = {}
const latencies = new Latencies()

instance.on('response', (_client: unknown, status: number, _bytes: number, ms: number) => {
  if (!span.measuring) return
  if (status === 201) {
    ok++
    latencies.add(ms)
  } else {
    non201[status] = (non201[status] ?? 0) + 1
  }
  // Bounded in count as well as in time.
  if (ok >= args.maxRequests) span.end()
})
instance.on('reqError', () => {
  if (span.measuring) errors++
})

await instance
span.end() // if autocannon ended on its own (it should not)
const result: Measured = { ok, items: ok * args.batch, non201, errors, latencyMs: latencies.summary(), cpu: span.cpu() }
process.stdout.write(`${JSON.stringify(result)}\n`)

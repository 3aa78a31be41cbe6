/**
 * Transactional produce load: `connections` loops, each on its own pg connection, each running
 * transactions of `batch` hookq_produce() calls (one SELECT over unnest for a batch) and COMMIT,
 * as an application producing inside its own transactions would. Runs as its own process; prints
 * one JSON line (Measured: items = messages committed in the window) on stdout.
 *
 * argv[2]: JSON { databaseUrl, topic, connections, batch, warmupS, measureS, maxRows, brokerPid }
 */
import pg from 'pg'
import { MESSAGE_VALUE_JSON } from './lib/payload.ts'
import { Latencies, type Measured } from './lib/stats.ts'
import { MeasureWindow } from './lib/window.ts'

interface Args {
  databaseUrl: string
  topic: string
  connections: number
  batch: number
  warmupS: number
  measureS: number
  maxRows: number
  brokerPid: number
}
const args = JSON.parse(process.argv[2] ?? '{}') as Args

const pool = new pg.Pool({ connectionString: args.databaseUrl, max: args.connections, application_name: 'hookq-bench-sql-produce' })
const values = Array.from({ length: args.batch }, () => MESSAGE_VALUE_JSON)
const ONE = 'SELECT hookq_produce($1, $2)'
const MANY = 'SELECT hookq_produce($1, v) FROM unnest($2::text[]) AS v'

const span = new MeasureWindow(args)
let ok = 0
let items = 0
let errors = 0
const latencies = new Latencies()

async function loop(): Promise<void> {
  const client = await pool.connect()
  try {
    while (!span.ended) {
      const t0 = performance.now()
      try {
        await client.query('BEGIN')
        await client.query(args.batch === 1 ? ONE : MANY, [args.topic, args.batch === 1 ? values[0] : values])
        await client.query('COMMIT')
        if (span.measuring) {
          ok++
          items += args.batch
          latencies.add(performance.now() - t0)
        }
      } catch {
        await client.query('ROLLBACK').catch(() => {})
        if (span.measuring) errors++
      }
      if (items >= args.maxRows) span.end()
    }
  } finally {
    client.release()
  }
}

await Promise.all(Array.from({ length: args.connections }, loop))
await pool.end()
const result: Measured = { ok, items, non201: {}, errors, latencyMs: latencies.summary(), cpu: span.cpu() }
process.stdout.write(`${JSON.stringify(result)}\n`)

/**
 * Baseline: what plain PostgreSQL does with one autocommitted single-row INSERT per message
 * through a pg Pool of 8, driven by 64 concurrent loops (like 64 clients). The row looks like a
 * stored message. Runs as its own process; prints one JSON line (Measured) on stdout.
 *
 * argv[2]: JSON { databaseUrl, poolSize, concurrency, warmupS, measureS, maxRows }
 */
import pg from 'pg'
import { MESSAGE_VALUE_JSON } from './lib/payload.ts'
import { Latencies, type Measured } from './lib/stats.ts'
import { MeasureWindow } from './lib/window.ts'

interface Args {
  databaseUrl: string
  poolSize: number
  concurrency: number
  warmupS: number
  measureS: number
  maxRows: number
}
const args = JSON.parse(process.argv[2] ?? '{}') as Args
const PARTITIONS = 8

const pool = new pg.Pool({ connectionString: args.databaseUrl, max: args.poolSize, application_name: 'hookq-bench-baseline' })
await pool.query(`CREATE TABLE IF NOT EXISTS bench_baseline (
  topic_id int NOT NULL, partition int NOT NULL, "offset" bigint NOT NULL,
  value text NOT NULL, produced_at timestamptz NOT NULL,
  PRIMARY KEY (topic_id, partition, "offset"))`)

// One event loop hands out offsets, so a plain counter per partition keeps the keys unique.
const nextOffset = new Array<number>(PARTITIONS).fill(0)
let seq = 0
const span = new MeasureWindow(args)
let ok = 0
let errors = 0
const latencies = new Latencies()

async function loop(): Promise<void> {
  while (!span.ended) {
    const partition = seq++ % PARTITIONS
    const offset = nextOffset[partition]!++
    const t0 = performance.now()
    try {
      await pool.query(
        'INSERT INTO bench_baseline (topic_id, partition, "offset", value, produced_at) VALUES ($1, $2, $3, $4, clock_timestamp())',
        [1, partition, offset, MESSAGE_VALUE_JSON],
      )
      if (span.measuring) {
        ok++
        latencies.add(performance.now() - t0)
      }
    } catch {
      if (span.measuring) errors++
    }
    if (ok >= args.maxRows) span.end()
  }
}

await Promise.all(Array.from({ length: args.concurrency }, loop))
await pool.end()
const result: Measured = { ok, items: ok, non201: {}, errors, latencyMs: latencies.summary(), cpu: span.cpu() }
process.stdout.write(`${JSON.stringify(result)}\n`)

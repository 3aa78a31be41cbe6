/**
 * A consumer process for consumer-exactly-once-kill.test.ts: the consumer helper with a
 * PgIdempotencyStore, whose handler inserts a row into `effects` through ctx.tx. With PAUSE it
 * stops at one point of a message, says so on stdout, and waits there until the test kills it:
 *   after-write    the handler wrote its row; the transaction is open        ("wrote <key>")
 *   after-commit   the store's COMMIT returned; the ack is not sent yet     ("committed <key>")
 */
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import pg from 'pg'
import { createConsumer, PgIdempotencyStore, type TransactionalIdempotencyStore } from '@hookq/client/consumer'

const pause = process.env.PAUSE ?? ''
const forever = () => new Promise<never>(() => {})
const pool = new pg.Pool({ connectionString: process.env.CONSUMER_DATABASE_URL, max: 4 })
const pgStore = new PgIdempotencyStore({ pool })
// The consumer acks when runOnce returns: holding its return holds the message between COMMIT and ack.
const store: TransactionalIdempotencyStore<pg.PoolClient> =
  pause !== 'after-commit'
    ? pgStore
    : {
        async runOnce(ids, work) {
          const fresh = await pgStore.runOnce(ids, work)
          if (fresh.length > 0) {
            console.log(`committed ${fresh.join(' ')}`)
            await forever()
          }
          return fresh
        },
      }

const consumer = createConsumer<number, pg.PoolClient>({
  secret: process.env.HOOKQ_WEBHOOK_SECRET,
  baseUrl: process.env.HOOKQ_URL,
  idempotency: store,
  async handler(m, { tx }) {
    await tx.query('INSERT INTO effects (webhook_id, value, pid) VALUES ($1, $2, $3)', [m.webhookId, m.value, process.pid])
    console.log(`wrote ${m.group}/${m.webhookId} attempt ${m.attempt}`)
    if (pause === 'after-write') await forever()
  },
})
const server = http.createServer(consumer.listener)
server.listen(0, '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}/`))

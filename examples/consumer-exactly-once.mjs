// A consumer whose writes to its PostgreSQL database happen exactly once: `node consumer-exactly-once.mjs`
// (an ES module; `npm install pg` too). DATABASE_URL is the consumer's own database, not hookq's.
import http from 'node:http'
import pg from 'pg'
import { createConsumer, PgIdempotencyStore } from '@hookq/client/consumer'

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL })
pool.on('error', (err) => console.error('an idle database connection failed:', err.message))
// Your table. Adding to a balance is not idempotent: a payment handled twice would count twice.
await pool.query('CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, cents bigint NOT NULL)')

// Records each handled message in table hookq_handled (created on first use), in the handler's transaction.
const handled = new PgIdempotencyStore({ pool })

const consumer = createConsumer({
  secret: process.env.HOOKQ_WEBHOOK_SECRET, // the consumer's whsec_... secret, as registered
  // acks and nacks go to HOOKQ_URL with HOOKQ_API_KEY (or pass baseUrl and apiKey, or client)
  idempotency: handled,
  async handler(message, { tx }) {
    // Write through tx: committed together with the message's id, then acked. A throw rolls both back.
    const { account, cents } = message.value
    await tx.query(
      'INSERT INTO balances (account, cents) VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET cents = balances.cents + EXCLUDED.cents',
      [account, cents],
    )
  },
})

// Ids are kept until pruned: forget them after 8 days, once the topic's retention (7 days) has passed.
setInterval(() => handled.prune({ olderThanMs: 8 * 86_400_000 }).catch(console.error), 3_600_000).unref()

const host = process.env.HOST ?? '127.0.0.1'
const server = http.createServer(consumer.listener)
server.listen(Number(process.env.PORT ?? 3000), host, () => {
  console.log(`consumer listening on http://${host}:${server.address().port}/`)
})

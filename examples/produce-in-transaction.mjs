// Produce inside your own transaction with node-postgres: `node produce-in-transaction.mjs`.
// DATABASE_URL is the broker's database; the topic `orders` exists (PUT /v1/topics/orders).
import pg from 'pg'

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL })
await pool.query('CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total numeric NOT NULL)')

const order = { id: `o-${Date.now()}`, total: 42.5 }
const client = await pool.connect()
try {
  await client.query('BEGIN')
  await client.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [order.id, order.total])
  // Produced if and only if this transaction commits; the key keeps an order's messages in order.
  const { rows } = await client.query('SELECT hookq_produce($1, $2, key => $3, idempotency_key => $4) AS id', [
    'orders',
    JSON.stringify({ type: 'order.created', order }),
    order.id,
    `created-${order.id}`,
  ])
  await client.query('COMMIT')
  console.log(`order ${order.id} stored; message ${rows[0].id} produced`)
} catch (err) {
  await client.query('ROLLBACK')
  throw err
} finally {
  client.release()
  await pool.end()
}

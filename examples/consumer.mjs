// A complete hookq consumer: `node consumer.mjs` (an ES module, for the top-level imports).
import http from 'node:http'
import { createConsumer } from '@hookq/client/consumer'

// Your code. Here it only prints the order; throw to have the message pushed again.
async function recordOrder(order) {
  console.log('order', JSON.stringify(order))
}

const consumer = createConsumer({
  secret: process.env.HOOKQ_WEBHOOK_SECRET, // the consumer's whsec_... secret, as registered
  // acks and nacks go to HOOKQ_URL with HOOKQ_API_KEY (or pass baseUrl and apiKey, or client)
  nackDelayMs: 5_000, // a failed message comes back after 5 s
  idempotency: true, // a redelivered webhook-id is acked, not handled again
  async handler(message) {
    await recordOrder(message.value)
  },
})
// Loopback only by default; HOST=0.0.0.0 when the broker runs on another machine.
const host = process.env.HOST ?? '127.0.0.1'
const server = http.createServer(consumer.listener)
server.listen(Number(process.env.PORT ?? 3000), host, () => {
  console.log(`consumer listening on http://${host}:${server.address().port}/`)
})

// Produce inside a Prisma transaction: `node --import tsx produce-in-transaction-prisma.ts`.
// DATABASE_URL is the broker's database; the topic `orders` exists (PUT /v1/topics/orders).
import { PrismaPg } from '@prisma/adapter-pg'
import { PrismaClient } from '../src/generated/prisma/client.ts' // your application's generated client

const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: process.env.DATABASE_URL }) })
await prisma.$executeRaw`CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total numeric NOT NULL)`

const order = { id: `o-${Date.now()}`, total: 42.5 }
const event = JSON.stringify({ type: 'order.created', order })
await prisma.$transaction(async (tx) => {
  await tx.$executeRaw`INSERT INTO orders (id, total) VALUES (${order.id}, ${order.total})`
  // Produced if and only if this transaction commits (a throw here rolls back both).
  await tx.$executeRaw`SELECT hookq_produce('orders', ${event}, key => ${order.id}, idempotency_key => ${`created-${order.id}`})`
})
console.log(`order ${order.id} stored; message produced`)
await prisma.$disconnect()

/** A broker per test file on its own database, built in-process (tests call it through inject or HTTP). */
import { createBroker, type Broker } from '../../src/broker.ts'
import { loadConfig } from '../../src/config.ts'
import { type TestDatabase, testDatabase } from './db.ts'

type Test = { teardown(fn: () => unknown): void }

/**
 * Starts a broker on a fresh test database, or on `opts.db` (one a file's brokers take in turn: the
 * embedded one serves one broker at a time); env overrides configuration (HOOKQ_* variables).
 */
export async function startBroker(t: Test, env: Record<string, string> = {}, opts: { db?: TestDatabase } = {}): Promise<Broker> {
  const db = opts.db ?? (await testDatabase(t))
  const config = loadConfig({
    DATABASE_URL: db.url,
    HOOKQ_DB_POOL_SIZE: String(Math.min(db.maxConnections, 8)),
    LOG_LEVEL: 'silent',
    ...env,
  })
  const broker = await createBroker(config)
  t.teardown(() => broker.close())
  return broker
}

/** Starts a broker listening on 127.0.0.1 with a free port; returns its base URL too. */
export async function startListeningBroker(t: Test, env: Record<string, string> = {}): Promise<{ broker: Broker; url: string }> {
  const broker = await startBroker(t, env)
  const url = await broker.app.listen({ host: '127.0.0.1', port: 0 })
  await broker.advertise(url)
  return { broker, url }
}

/** A node-postgres pool of a test's own (a consumer's database, say), ended at teardown. */
import pg from 'pg'

/**
 * pool.end() resolves once its clients are told to close, before their connections are gone, and
 * testDatabase's teardown then drops the database WITH (FORCE), which can terminate one of them: a
 * pool without an 'error' listener would throw that from the event loop (src/store/db.ts listens
 * for the same reason).
 */
export function testPool(t: { teardown(fn: () => unknown): void }, url: string, max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max })
  pool.on('error', () => {})
  t.teardown(() => pool.end())
  return pool
}

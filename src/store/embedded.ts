/**
 * The embedded database: PostgreSQL compiled to WebAssembly (PGlite) with its data directory on
 * disk, served on a loopback port so the rest of hookq talks to it through `pg` like to any server.
 *
 * PGlite is one single-user backend. The socket server takes ONE connection at a time (a second
 * one is refused: "Connection terminated unexpectedly"), so callers use a pool of max 1.
 * pglite-socket 0.2 has a `maxConnections` option that multiplexes several sockets onto that one
 * backend, but they would share one session (transactions, advisory locks, prepared statements),
 * so we keep it at 1.
 *
 * SIGKILL: __SIGKILL_FINDINGS__
 */
import { mkdir, readFile, unlink, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import { PGLiteSocketServer } from '@electric-sql/pglite-socket'

/** A running embedded database. */
export interface EmbeddedDatabase {
  /** postgresql://postgres@127.0.0.1:<port>/postgres, for `pg`. */
  connectionString: string
  /** The server takes one connection at a time: size pools accordingly. */
  maxConnections: 1
  /** Stops the server and closes PGlite, which flushes the data directory. Idempotent. */
  close(): Promise<void>
}

/**
 * Opens PGlite on `dataDir` (created if missing; `'memory'` keeps everything in memory, for tests)
 * and serves it on 127.0.0.1 on a free port.
 */
export async function startEmbedded(opts: {
  dataDir: string | 'memory'
  log?: (msg: string) => void
}): Promise<EmbeddedDatabase> {
  const log = opts.log ?? (() => {})
  const startedMs = performance.now()
  let db: PGlite
  let unlock = async () => {}
  if (opts.dataDir === 'memory') {
    db = await PGlite.create()
  } else {
    await mkdir(opts.dataDir, { recursive: true })
    unlock = await lockDataDir(opts.dataDir)
    db = await PGlite.create(opts.dataDir).catch(async (err: unknown) => {
      await unlock()
      throw err
    })
  }
  const server = new PGLiteSocketServer({ db, host: '127.0.0.1', port: 0, maxConnections: 1 })
  try {
    await server.start()
  } catch (err) {
    await db.close()
    await unlock()
    throw err
  }
  // getServerConn() is "127.0.0.1:<port>" once listening; port 0 asked the OS for a free one.
  const address = server.getServerConn()
  log(`embedded database ${opts.dataDir} on ${address} (${Math.round(performance.now() - startedMs)} ms)`)
  let closing: Promise<void> | undefined
  return {
    connectionString: `postgresql://postgres@${address}/postgres`,
    maxConnections: 1,
    close() {
      closing ??= (async () => {
        try {
          await server.stop()
        } finally {
          await db.close()
          await unlock()
        }
      })()
      return closing
    },
  }
}

const LOCK_FILE = 'hookq.lock'
const heldLocks = new Set<string>()

/**
 * PGlite does not lock its data directory: a second process opens it happily and both write to it.
 * A pid file refuses that. A pid file left by a killed process is taken over when that process is
 * gone, or when it names this very process but not from this run (a container restarted as pid 1).
 * Returns the release function.
 */
async function lockDataDir(dataDir: string): Promise<() => Promise<void>> {
  const file = path.join(path.resolve(dataDir), LOCK_FILE)
  for (;;) {
    try {
      await writeFile(file, `${process.pid}\n`, { flag: 'wx' })
      heldLocks.add(file)
      return async () => {
        heldLocks.delete(file)
        await unlink(file).catch(() => {})
      }
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
    }
    const holder = Number.parseInt(await readFile(file, 'utf8').catch(() => ''), 10)
    if (heldLocks.has(file) || (holder !== process.pid && isAlive(holder))) {
      throw new Error(`the data directory ${dataDir} is in use by process ${holder}`)
    }
    // Stale. Two starters taking over the same stale file at the same instant could both succeed;
    // we accept that: the lock is there to catch a second start by mistake, not to arbitrate races.
    await unlink(file).catch(() => {})
  }
}

function isAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false
  try {
    process.kill(pid, 0) // signal 0 checks existence without signalling
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM' // exists, owned by someone else
  }
}

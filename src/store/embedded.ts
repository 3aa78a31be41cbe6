/**
 * The embedded database: PostgreSQL compiled to WebAssembly (PGlite) with its data directory on
 * disk, served on a loopback port so the rest of hookq talks to it through `pg` like to any server.
 *
 * One connection at a time. PGlite is a single backend session; pglite-socket either refuses a
 * second socket outright or (maxConnections > 1) feeds several sockets into that one session, where
 * their transactions and extended-protocol messages would mix. So we admit one socket at a time and
 * make the next one wait until it has closed (up to ADMIT_WAIT_MS). Refusing outright broke pg-pool,
 * which replaces its connection after any failed query and opens the new one while the old socket
 * is still closing. Callers use a pool of max 1.
 *
 * What a SIGKILL does (measured with PGlite 0.5.14 / PostgreSQL 18.6, Linux, ext4): we killed a
 * process inserting rows through this server 15 times (mid-stream, idle, inside an open transaction).
 * Every row whose autocommitted INSERT had returned was there after reopening, once one more
 * (committed but not yet reported); rows of the open transaction were gone; the directory was never
 * corrupt (reopening runs WAL recovery in ~0.4 s; full scans and REINDEX passed). 39 kills during
 * the first start of a new directory (initdb), some after PG_VERSION was written, all left a
 * directory that opened and took writes. PGlite writes through to the OS at each commit, so a killed
 * process loses nothing the OS already has. It never asks the OS to flush, though: PGlite starts
 * PostgreSQL with fsync=off, and even with fsync=on strace shows no fsync/fdatasync call (Emscripten's
 * NODEFS does not pass them on), so a kernel crash or power loss can lose recent commits or corrupt
 * the directory. PGlite does not lock its directory either: a second process opens it while the
 * first is running, and both write; hence the pid file below.
 */
import { mkdir, link, readdir, readFile, rename, rm, stat, unlink, writeFile } from 'node:fs/promises'
import { openAsBlob } from 'node:fs'
import type { Socket } from 'node:net'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { PGlite } from '@electric-sql/pglite'
import { PGLiteSocketServer } from '@electric-sql/pglite-socket'

/** How long a second connection waits for the first to close before it is refused (default). */
const ADMIT_WAIT_MS = 10_000
/** Sockets accepted at once (one served, the rest waiting); Node refuses the ones beyond. */
const MAX_WAITING_SOCKETS = 64

/** A running embedded database. */
export interface EmbeddedDatabase {
  /** postgresql://postgres@127.0.0.1:<port>/postgres, for `pg`. */
  connectionString: string
  /** The server serves one connection at a time: size pools accordingly. */
  maxConnections: 1
  /** Stops the server and shuts PGlite down cleanly (releasing the data directory). Idempotent. */
  close(): Promise<void>
  /**
   * The cluster as a tar, after a checkpoint (so a copy started from it replays no WAL), for
   * startEmbedded's `cluster`. Call it with no connection open: it runs in the served session.
   */
  dump(): Promise<Blob>
}

/**
 * Opens PGlite on `dataDir` (created if missing; `'memory'` keeps everything in memory, for tests)
 * and serves it on 127.0.0.1 on a free port. Refuses a data directory another process has open.
 */
export async function startEmbedded(opts: {
  dataDir: string | 'memory'
  /** With dataDir 'memory': start from this cluster (a dump()) instead of a fresh one. */
  cluster?: Blob
  log?: (msg: string) => void
  /** How long a connection waits for the one being served to close, ms (default ADMIT_WAIT_MS). */
  admitWaitMs?: number
}): Promise<EmbeddedDatabase> {
  const log = opts.log ?? (() => {})
  const startedMs = performance.now()
  let db: PGlite
  let unlock = async () => {}
  if (opts.dataDir === 'memory') {
    db = opts.cluster ? await PGlite.create({ loadDataDir: opts.cluster }) : await openInMemory()
  } else {
    await mkdir(opts.dataDir, { recursive: true })
    unlock = await lockDataDir(opts.dataDir)
    db = await openOnDisk(opts.dataDir, log).catch(async (err: unknown) => {
      await unlock()
      throw err
    })
  }
  const server = new PGLiteSocketServer({ db, host: '127.0.0.1', port: 0, maxConnections: MAX_WAITING_SOCKETS })
  admitOneAtATime(server, db, opts.admitWaitMs ?? ADMIT_WAIT_MS)
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
    async dump() {
      await db.exec('CHECKPOINT')
      return db.dumpDataDir('none')
    },
  }
}

// Each server socket is handed to pglite-socket's private handleConnection (pglite-socket is pinned
// to 0.2.17); we delay that call until no other socket is being served.
//
// Every socket is served by the same PGlite session, so what a connection leaves in it would be
// there for the next: its prepared statements (pg-pool replaces a connection after a failed query,
// and the new one's PREPARE of a statement the old one prepared failed with 42P05, for ever: one
// refused attempt row stopped the attempt log), its advisory locks, LISTENs and settings.
// pglite-socket rolls back a transaction left open; before the next socket is served the session
// is reset as a new one would be (DISCARD ALL, what connection poolers run between clients).
function admitOneAtATime(server: PGLiteSocketServer, db: PGlite, admitWaitMs: number): void {
  const internals = server as unknown as { handleConnection(socket: Socket): Promise<void> }
  const admit = internals.handleConnection.bind(server)
  // Sockets are let in one at a time, in arrival order: the reset below awaits, and a second waiter
  // must not pass the check while the first is between it and admit().
  let turns: Promise<unknown> = Promise.resolve()
  internals.handleConnection = (socket) => {
    socket.on('error', () => {}) // a waiting client that resets must not crash the process
    const turn = turns.then(() => admitWhenFree(socket))
    turns = turn.catch(() => {})
    return turn
  }
  const admitWhenFree = async (socket: Socket) => {
    const deadline = Date.now() + admitWaitMs
    while (server.getStats().activeConnections > 0) {
      if (socket.destroyed) return // the client gave up waiting
      if (Date.now() > deadline) {
        socket.end('Too many connections\n') // what pglite-socket answers when full
        return
      }
      await sleep(2)
    }
    if (socket.destroyed) return
    if (db.isInTransaction()) await db.exec('ROLLBACK')
    await db.exec('DISCARD ALL')
    // admit() registers the socket before its first await, so the next waiter sees it as active.
    return admit(socket)
  }
}

// A new PGlite cluster runs initdb in WebAssembly: 4-5 s of CPU, 11 s on a busy 2-core machine,
// nearly all of a first start (migrations took 0.6 s). A copy of a fresh cluster loads in 0.5-2 s.
// So the first cluster made is kept as a tar (40 MB) under node_modules/.cache/hookq, one per PGlite
// version, and every later new cluster starts from it: the first `npm start`, every test file's
// in-memory database, every test broker's data directory. `npm install` makes it (postinstall), so a
// newcomer's first start does not pay initdb either; where it cannot be written, initdb runs as before.
let freshCluster: Promise<Blob | undefined> | undefined

/** The kept fresh cluster, made now (initdb, in memory) if there is none. */
export function freshClusterTar(): Promise<Blob | undefined> {
  freshCluster ??= keptCluster('', async () => {
    const db = await PGlite.create()
    try {
      return await db.dumpDataDir('none')
    } finally {
      await db.close()
    }
  })
  freshCluster.catch(() => (freshCluster = undefined))
  return freshCluster
}

/**
 * A cluster kept as node_modules/.cache/hookq/pglite-<version><suffix>.tar (a cluster is tied to
 * the PGlite that made it): read from there, or made by `make` and written there for the next
 * process. The test helpers keep a migrated one the same way (test/helpers/db.ts).
 */
export async function keptCluster(suffix: string, make: () => Promise<Blob>): Promise<Blob> {
  const pkg = new URL('../package.json', import.meta.resolve('@electric-sql/pglite'))
  const { version } = JSON.parse(await readFile(pkg, 'utf8')) as { version: string }
  const file = fileURLToPath(new URL(`../../node_modules/.cache/hookq/pglite-${version}${suffix}.tar`, import.meta.url))
  try {
    // Backed by the file, read when PGlite loads it: a copy of 40 MB into a Blob first was a fifth
    // of a test database's start (0.35 of 1.8 s of CPU).
    return await openAsBlob(file)
  } catch {}
  const tar = await make()
  // Written whole under a name of its own, then linked to its name, never over a file there: a
  // Blob opened from that file fails once the file is replaced (processes racing to make it).
  const part = `${file}.${process.pid}.${Date.now()}`
  try {
    await mkdir(path.dirname(file), { recursive: true })
    await writeFile(part, new Uint8Array(await tar.arrayBuffer()))
    await link(part, file).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err // made by another process meanwhile: theirs stays
    })
  } catch {
    // A read-only node_modules: this process keeps it in memory.
  } finally {
    await unlink(part).catch(() => {})
  }
  return tar
}

async function openInMemory(): Promise<PGlite> {
  const tar = await freshClusterTar().catch(() => undefined)
  return tar ? PGlite.create({ loadDataDir: tar }) : PGlite.create() // initdb
}

/**
 * Opens the cluster in `dataDir`, making it first from the fresh cluster if there is none. The
 * copy is loaded in a directory beside it and moved in, PG_VERSION last (PGlite takes a directory
 * with PG_VERSION for a cluster): a start killed midway leaves no half-made cluster, only files the
 * next start replaces.
 */
async function openOnDisk(dataDir: string, log: (msg: string) => void): Promise<PGlite> {
  if (await exists(path.join(dataDir, 'PG_VERSION'))) return PGlite.create(dataDir)
  const tar = await freshClusterTar().catch(() => undefined)
  if (!tar) return PGlite.create(dataDir) // initdb in place
  const building = `${path.resolve(dataDir)}.new-${process.pid}`
  await rm(building, { recursive: true, force: true })
  try {
    const db = await PGlite.create(building, { loadDataDir: tar })
    await db.close()
    const entries = (await readdir(building)).sort((a, b) => Number(a === 'PG_VERSION') - Number(b === 'PG_VERSION'))
    for (const entry of entries) {
      await rm(path.join(dataDir, entry), { recursive: true, force: true }) // left by a start killed midway
      await rename(path.join(building, entry), path.join(dataDir, entry))
    }
  } finally {
    await rm(building, { recursive: true, force: true })
  }
  log(`embedded database: made ${dataDir} from a fresh cluster`)
  return PGlite.create(dataDir)
}

async function exists(file: string): Promise<boolean> {
  try {
    await stat(file)
    return true
  } catch {
    return false
  }
}

const LOCK_FILE = 'hookq.lock'
const heldLocks = new Set<string>()

/**
 * Refuses a data directory another process has open, with a pid file in it. A pid file left by a
 * killed process is taken over when that process is gone, or when it names this very process but
 * not from this run (a container restarted as pid 1). Returns the release function.
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

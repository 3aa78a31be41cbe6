/**
 * A PostgreSQL server of the test's own (initdb in a temporary directory, on a free loopback
 * port), for faults that would hurt everybody else on the shared server: `pg_ctl stop -m
 * immediate` (a crash: no checkpoint, WAL replay at the next start) and a start again.
 *
 * Uses the machine's PostgreSQL binaries (/usr/lib/postgresql/<version>/bin). initdb refuses to
 * run as root, so as root the server runs as the `postgres` user (runuser). Where neither works,
 * `privatePostgresUnavailable()` says why and the test skips.
 */
import { execFile } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { chown, mkdtemp, rm } from 'node:fs/promises'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { START_LIMIT_MS } from './process.ts'

const run = promisify(execFile)
const ROOT = '/usr/lib/postgresql'

function binDir(): string | undefined {
  if (!existsSync(ROOT)) return undefined
  const versions = readdirSync(ROOT)
    .filter((v) => existsSync(join(ROOT, v, 'bin', 'pg_ctl')))
    .sort((a, b) => Number(b) - Number(a))
  return versions[0] ? join(ROOT, versions[0], 'bin') : undefined
}

/** Why a private server cannot be started here, or false when it can. */
export function privatePostgresUnavailable(): string | false {
  if (!binDir()) return `no PostgreSQL binaries under ${ROOT}`
  if (process.getuid?.() === 0 && !existsSync('/usr/sbin/runuser') && !existsSync('/sbin/runuser')) return 'running as root without runuser'
  return false
}

export interface PrivatePostgres {
  /** postgresql:// URL of the `postgres` database on it. */
  url: string
  port: number
  /** `pg_ctl stop -m immediate`: every backend killed at once, no checkpoint. */
  stopImmediate(): Promise<void>
  start(): Promise<void>
  /** The server's log, for a failing test's message. */
  logFile: string
}

async function freePort(): Promise<number> {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as net.AddressInfo).port
  await new Promise((resolve) => server.close(resolve))
  return port
}

/** initdb and start; stopped (immediately) and removed at teardown. */
export async function startPrivatePostgres(t: { teardown(fn: () => unknown): void }): Promise<PrivatePostgres> {
  const bin = binDir()
  if (!bin) throw new Error(privatePostgresUnavailable() || 'no PostgreSQL binaries')
  const asRoot = process.getuid?.() === 0
  const dir = await mkdtemp(join(tmpdir(), 'hookq-pg-'))
  if (asRoot) {
    const { stdout } = await run('id', ['-u', 'postgres'])
    const { stdout: gid } = await run('id', ['-g', 'postgres'])
    await chown(dir, Number(stdout.trim()), Number(gid.trim()))
  }
  const pgrun = (tool: string, args: string[]) =>
    asRoot
      ? run('runuser', ['-u', 'postgres', '--', join(bin, tool), ...args], { timeout: START_LIMIT_MS })
      : run(join(bin, tool), args, { timeout: START_LIMIT_MS })
  const data = join(dir, 'data')
  const logFile = join(dir, 'server.log')
  const port = await freePort()
  await pgrun('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  // Durable settings, as production would run (fsync on): the crash test is about them.
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=50`
  const start = async () => {
    await pgrun('pg_ctl', ['-D', data, '-l', logFile, '-o', options, '-w', '-t', String(START_LIMIT_MS / 1000), 'start'])
  }
  const stopImmediate = async () => {
    await pgrun('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop'])
  }
  t.teardown(async () => {
    await stopImmediate().catch(() => {})
    await rm(dir, { recursive: true, force: true })
  })
  await start()
  return { url: `postgresql://postgres@127.0.0.1:${port}/postgres`, port, stopImmediate, start, logFile }
}

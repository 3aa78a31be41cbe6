/** A server the bench does not start (RabbitMQ, NATS): whether it answers, and which process it is (for its CPU). */
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { connect as netConnect } from 'node:net'

/** True if something accepts TCP connections on host:port within `timeoutMs`. */
export function reachable(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = netConnect({ host, port })
    const done = (ok: boolean) => {
      socket.destroy()
      resolve(ok)
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.once('connect', () => done(true))
    socket.once('error', () => done(false))
  })
}

/**
 * The pid of the process listening on loopback `port` (for RabbitMQ: beam.smp), from `ss -ltnp`;
 * failing that, the only process named `fallbackComm`. Undefined when neither tells.
 */
export function listenerPid(port: number, fallbackComm: string): number | undefined {
  try {
    const out = execFileSync('ss', ['-Hltnp', `sport = :${port}`], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    const m = /pid=(\d+)/.exec(out)
    if (m) return Number(m[1])
  } catch {
    // no ss here: look by name
  }
  const pids = readdirSync('/proc').filter((name) => {
    if (!/^\d+$/.test(name)) return false
    try {
      return readFileSync(`/proc/${name}/comm`, 'utf8').trim() === fallbackComm
    } catch {
      return false
    }
  })
  return pids.length === 1 ? Number(pids[0]) : undefined
}

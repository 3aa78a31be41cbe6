/**
 * CPU accounting from /proc over a measurement window: the broker process, the PostgreSQL server
 * processes, the measuring process itself and the whole host. On a shared 2-core machine the
 * load generator and PostgreSQL compete with the broker, so all of them are needed to judge a result.
 */
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { cpus } from 'node:os'

/** Clock ticks per second of /proc times (USER_HZ): 100 on practically every Linux. */
const HZ = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
  } catch {
    return 100
  }
})()

/**
 * The fields of /proc/<pid>/stat from field 3 (state) on, so field n is at index n - 3; undefined
 * when the process is gone. comm (field 2) may hold spaces or parentheses: split only after its ')'.
 */
function statFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  } catch {
    return undefined
  }
}

/** utime + stime (fields 14 and 15) of a process in seconds; undefined when it is gone. */
export function processCpuSeconds(pid: number): number | undefined {
  const fields = statFields(pid)
  return fields && (Number(fields[11]) + Number(fields[12])) / HZ
}

/** The parent process's id (field 4); undefined when the process is gone. */
function parentPid(pid: number): number | undefined {
  const fields = statFields(pid)
  return fields && Number(fields[1])
}

/**
 * The postmaster whose processes are counted as PostgreSQL's: set by `countPostgresOf`. Unset, every
 * process named postgres counts, and another server on the machine (a test suite's private one, say)
 * would be added to the bench's figures.
 */
let postmaster: number | undefined

/**
 * Counts only the server that runs `backendPid` (a session's pg_backend_pid()): its postmaster and
 * the postmaster's children (backends, WAL writer, …). A server on another machine leaves the count as it is.
 */
export function countPostgresOf(backendPid: number): void {
  const pid = parentPid(backendPid)
  try {
    if (pid !== undefined && readFileSync(`/proc/${pid}/comm`, 'utf8') === 'postgres\n') postmaster = pid
  } catch {
    // not a process of this machine
  }
}

/**
 * The databases whose backends are counted as PostgreSQL's (see `countPostgresDatabases`); unset,
 * the backends of every database count.
 */
let databases: Set<string> | undefined

/**
 * Counts only the backends (and autovacuum workers) of `names`, beside the server's shared
 * processes (checkpointer, WAL writer, …); `[]`: the shared processes alone; `undefined`: every
 * backend again. For a server other work uses meanwhile (a test suite's databases), whose backends
 * then show as other tenants' CPU rather than as the bench's.
 */
export function countPostgresDatabases(names: string[] | undefined): void {
  databases = names && new Set(names)
}

/**
 * The database a postgres process serves, from its title: "postgres: [cluster: ]user db host(port) …"
 * for a backend, "postgres: [cluster: ]autovacuum worker db"; undefined for a shared process.
 */
function databaseOf(pid: number): string | undefined {
  let title: string
  try {
    title = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim()
  } catch {
    return undefined
  }
  const worker = /: autovacuum worker (\S+)/.exec(title)
  if (worker) return worker[1]
  const backend = /^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])/.exec(title)
  return backend?.[1]
}

/** CPU seconds of the server's processes (every process named postgres, unless countPostgresOf and countPostgresDatabases said which), by pid. */
function postgresCpu(): Map<number, number> {
  const byPid = new Map<number, number>()
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      if (readFileSync(`/proc/${name}/comm`, 'utf8') !== 'postgres\n') continue
    } catch {
      continue
    } // exited meanwhile
    if (postmaster !== undefined && Number(name) !== postmaster && parentPid(Number(name)) !== postmaster) continue
    if (databases !== undefined) {
      const db = databaseOf(Number(name))
      if (db !== undefined && !databases.has(db)) continue
    }
    const s = processCpuSeconds(Number(name))
    if (s !== undefined) byPid.set(Number(name), s)
  }
  return byPid
}

/** Busy and total jiffies of the whole host (first line of /proc/stat). */
function hostJiffies(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!
  const [user, nice, system, idle, iowait, irq, softirq, steal] = line.trim().split(/\s+/).slice(1, 9).map(Number) as number[]
  const total = user! + nice! + system! + idle! + iowait! + irq! + softirq! + steal!
  return { busy: total - idle! - iowait!, total }
}

export interface CpuSnapshot {
  at: number
  broker: number | undefined
  self: number
  pg: Map<number, number>
  host: { busy: number; total: number }
}

/** CPU use over a window, in % of one core (the host figure in % of all its cores). */
export interface CpuWindow {
  seconds: number
  brokerPct: number
  postgresPct: number
  selfPct: number
  hostPct: number
  cores: number
}

export function cpuSnapshot(brokerPid: number | undefined): CpuSnapshot {
  const u = process.cpuUsage()
  return {
    at: performance.now(),
    broker: brokerPid === undefined ? undefined : processCpuSeconds(brokerPid),
    self: (u.user + u.system) / 1e6,
    pg: postgresCpu(),
    host: hostJiffies(),
  }
}

export function cpuSince(start: CpuSnapshot, brokerPid: number | undefined): CpuWindow {
  const end = cpuSnapshot(brokerPid)
  const seconds = (end.at - start.at) / 1000
  const pct = (cpuSeconds: number) => (100 * cpuSeconds) / seconds
  let pg = 0
  // A backend started inside the window counts from zero; one that exited is lost (pools keep theirs).
  for (const [pid, s] of end.pg) pg += s - (start.pg.get(pid) ?? 0)
  return {
    seconds,
    brokerPct: start.broker === undefined || end.broker === undefined ? NaN : pct(end.broker - start.broker),
    postgresPct: pct(pg),
    selfPct: pct(end.self - start.self),
    hostPct: (100 * (end.host.busy - start.host.busy)) / Math.max(1, end.host.total - start.host.total),
    cores: cpus().length,
  }
}

/** CPU per message over a window, us: the broker's (its process, or `brokerS` seconds counted otherwise) and PostgreSQL's. */
export function perMessage(
  w: CpuWindow,
  messages: number,
  brokerS = (w.brokerPct * w.seconds) / 100,
): { brokerUs: number; postgresUs: number } {
  const n = Math.max(1, messages)
  return { brokerUs: (1e6 * brokerS) / n, postgresUs: (1e4 * w.postgresPct * w.seconds) / n }
}

/** The host's busy CPU beyond the broker, PostgreSQL and this process, % of one core: the load, the receiver, other tenants. */
export function othersPct(w: CpuWindow): number {
  return w.hostPct * w.cores - (Number.isNaN(w.brokerPct) ? 0 : w.brokerPct) - w.postgresPct - w.selfPct
}

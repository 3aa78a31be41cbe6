/**
 * `HOOKQ_PROCESSES=N`: one command runs N broker processes on one port (node:cluster), so every
 * core takes HTTP work — produce, reads, acks — each process on a pool of its own. They coordinate
 * only through PostgreSQL, exactly like processes started by hand (src/cluster/ownership.ts): each
 * pushes its share of the partitions and forwards acks for the others to their owners, each over a loopback
 * port of its own, since calls to the shared port land on any of them.
 *
 * The primary here runs no broker: it starts the workers, starts a worker again when one dies
 * (after a short, growing pause, so a worker that cannot start does not spin), and on SIGTERM or
 * SIGINT passes the signal on and exits once every worker has, 0 only if all of them exited 0.
 *
 * The workers accept their connections themselves, from the listening socket they share
 * (SCHED_NONE), rather than from the primary. In node:cluster's default round-robin the primary
 * accepts and hands each connection to a worker, keeping its own copy until the worker confirms;
 * a worker killed before confirming left that copy open and its client waiting for ever
 * (test/process/processes.test.ts). Here a connection is held only by the process that accepted it,
 * so when that process dies the kernel closes it and the client sees an error; connections not yet
 * accepted wait in the shared queue for the processes that live.
 */
import cluster, { type Worker } from 'node:cluster'
import type { Logger } from 'pino'
import { timerDelayMs } from '../core/timer-delay.ts'

/** Restart pauses: 100 ms, doubling per failure in a row, at most 10 s. */
const RESTART_MIN_MS = 100
const RESTART_MAX_MS = 10_000
/** A worker that lived this long before dying resets the pause. */
const HEALTHY_MS = 30_000

/** Runs the primary of `processes` workers until they have all stopped; resolves with the exit code. */
export function runPrimary(processes: number, logger: Logger): Promise<number> {
  let stopping = false
  let failures = 0
  let worst = 0
  const startedAt = new Map<Worker, number>()
  const start = () => {
    startedAt.set(cluster.fork(), Date.now())
  }
  // Before the first fork: the policy is fixed from then on.
  cluster.schedulingPolicy = cluster.SCHED_NONE
  return new Promise((resolve) => {
    cluster.on('exit', (worker, code, signal) => {
      const lived = Date.now() - (startedAt.get(worker) ?? Date.now())
      startedAt.delete(worker)
      if (stopping) {
        if (code !== 0) worst = 1
        if (startedAt.size === 0) resolve(worst)
        return
      }
      failures = lived >= HEALTHY_MS ? 1 : failures + 1
      const pauseMs = Math.min(RESTART_MAX_MS, RESTART_MIN_MS * 2 ** (failures - 1))
      logger.error({ pid: worker.process.pid, code, signal, restartInMs: pauseMs }, 'a broker process exited; starting another')
      setTimeout(() => {
        if (!stopping) start()
      }, timerDelayMs(pauseMs)).unref()
    })
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) {
        logger.warn({ signal }, 'second signal: ending the broker processes now')
        for (const w of startedAt.keys()) w.process.kill('SIGKILL')
        return
      }
      stopping = true
      logger.info({ signal, processes: startedAt.size }, 'shutting down the broker processes')
      if (startedAt.size === 0) resolve(0)
      for (const w of startedAt.keys()) w.process.kill(signal)
    }
    process.on('SIGTERM', () => stop('SIGTERM'))
    process.on('SIGINT', () => stop('SIGINT'))
    logger.info({ processes }, `starting ${processes} broker processes`)
    for (let i = 0; i < processes; i++) start()
  })
}

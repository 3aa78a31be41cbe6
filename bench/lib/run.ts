/**
 * What a benchmark run has started (its throw-away database and broker, plus the worker children
 * lib/child.ts tracks) and how to stop all of it: at the end, on failure, and on Ctrl-C.
 */
import type { BrokerProcess } from './broker.ts'
import { stopBroker } from './broker.ts'
import { children, stopChild } from './child.ts'
import type { BenchDatabase } from './db.ts'

export const run: { db?: BenchDatabase; broker?: BrokerProcess; interrupted: boolean } = { interrupted: false }

let cleaning: Promise<void> | undefined
const steps = new Set<() => Promise<void>>()

/**
 * Adds a step to the cleanup, for what a bench holds beyond run.db and run.broker (bench/peers.ts:
 * a database per system, a RabbitMQ queue). Runs after the workers and the broker have stopped;
 * the returned function removes the step again (the bench released the thing itself).
 */
export function atCleanup(step: () => Promise<void>): () => void {
  steps.add(step)
  return () => steps.delete(step)
}

/**
 * Teardown steps of one setup, run in reverse order; each is also registered with the run's
 * cleanup (failure, Ctrl-C) until it has run. A step runs once: an interrupt during run() waits
 * for the same step instead of starting it again or exiting before it ends.
 */
export class Undo {
  private steps: { step: () => Promise<void>; forget: () => void }[] = []
  add(step: () => Promise<void>): void {
    let done: Promise<void> | undefined
    const once = () => {
      done ??= step()
      return done
    }
    this.steps.push({ step: once, forget: atCleanup(once) })
  }
  async run(): Promise<void> {
    for (const { step, forget } of this.steps.reverse()) {
      await step().catch((err: unknown) => console.error('teardown:', err))
      forget()
    }
    this.steps = []
  }
}

/** Runs `build` with an Undo; if it throws, undoes what it did. The result's stop() undoes it all. */
export async function building<T extends object>(build: (undo: Undo) => Promise<T>): Promise<T & { stop(): Promise<void> }> {
  const undo = new Undo()
  try {
    const setup = await build(undo)
    return { ...setup, stop: () => undo.run() }
  } catch (err) {
    await undo.run()
    throw err
  }
}

/** Stops the workers (only ours, by pid), then the broker gracefully, then the added steps, then drops the database. Once. */
export function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    await Promise.all([...children].filter((c) => c !== run.broker?.child).map((c) => stopChild(c, 2000, 'SIGKILL')))
    if (run.broker) await stopBroker(run.broker).catch((err: unknown) => console.error('stopping the broker:', err))
    for (const step of steps) await step().catch((err: unknown) => console.error('cleanup:', err))
    if (run.db && !process.env.BENCH_KEEP_DB) await run.db.drop().catch((err: unknown) => console.error(`dropping ${run.db!.name}:`, err))
  })()
  return cleaning
}

/** On SIGINT/SIGTERM: say what is being stopped, clean up, exit 130. */
export function cleanUpOnInterrupt(what: string): void {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.on(signal, () => {
      if (run.interrupted) return
      run.interrupted = true
      console.error(`\n${signal}: stopping ${what}, dropping the bench database`)
      void cleanup().finally(() => process.exit(130))
    })
  }
}

/**
 * Runs a benchmark's main: a failure (not an interruption, which cleans up on its own) is printed
 * and exits 1; either way what the run started is stopped and its database dropped.
 */
export async function runBench(main: () => Promise<void>): Promise<void> {
  try {
    await main()
  } catch (err) {
    if (!run.interrupted) {
      console.error('bench failed:', err instanceof Error ? (err.stack ?? err.message) : err)
      process.exitCode = 1
    }
  } finally {
    await cleanup()
  }
}

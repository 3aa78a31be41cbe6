/**
 * Runs one group of the suite's files in this process (test/groups/NN.test.ts, one tap process
 * each). Most files pay more to start than to run their tests (Node and tap, ~300 modules through
 * the TypeScript hook, a broker's first start): a group pays that once for its files. Each file runs
 * as a subtest named after it, to its end before the next, with tap's limit for a file; its brokers
 * and databases close when it ends (its `t` is that subtest: test/helpers/tap.ts).
 *
 * Every test/<folder>/*.test.ts that is not one of the slow files (package.json's tap.exclude, which
 * `npm run test:faults` runs) belongs to exactly one group: the files, sorted, are dealt round-robin
 * to the groups (as many as test/groups holds), so that each group gets a mix of cheap and dear
 * ones. A file still runs alone: `npx tap test/http/topics.test.ts`.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { basename, dirname, join, relative } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import tap from 'tap'
import { cpuNow, logCpu } from '../../scripts/test-cpu-log.mjs'
import { runFileOn } from './tap.ts'

const TEST_DIR = fileURLToPath(new URL('..', import.meta.url))
const ROOT = dirname(TEST_DIR.replace(/\/$/, ''))

/** Every grouped file, relative to the project root, sorted. */
export function groupedFiles(): string[] {
  const slow = new Set<string>(JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).tap.exclude)
  const files: string[] = []
  for (const folder of readdirSync(TEST_DIR, { withFileTypes: true })) {
    if (!folder.isDirectory() || folder.name === 'groups' || folder.name === 'helpers') continue
    for (const name of readdirSync(join(TEST_DIR, folder.name))) {
      const file = `test/${folder.name}/${name}`
      if (name.endsWith('.test.ts') && !slow.has(file)) files.push(file)
    }
  }
  return files.sort()
}

/** The files of the group whose entry file is `entryUrl` (test/groups/NN.test.ts: group NN). */
export function filesOf(entryUrl: string): string[] {
  const entries = readdirSync(join(TEST_DIR, 'groups'))
    .filter((n) => n.endsWith('.test.ts'))
    .sort()
  const index = entries.indexOf(basename(fileURLToPath(entryUrl)))
  if (index < 0) throw new Error(`${entryUrl} is not in test/groups`)
  return groupedFiles().filter((_, i) => i % entries.length === index)
}

/** Runs the group of `entryUrl`, one file after another. */
export async function runGroup(entryUrl: string): Promise<void> {
  const files = filesOf(entryUrl)
  // tap's limit is per process (TAP_TIMEOUT, seconds): here it is each file's, and the process's is
  // the sum, a backstop for a file that hangs past its own.
  const fileLimitMs = Number(process.env.TAP_TIMEOUT || 30) * 1000
  tap.setTimeout(fileLimitMs * files.length)
  const cpuLog = process.env.HOOKQ_TEST_CPU_LOG
  const group = relative(ROOT, fileURLToPath(entryUrl))
  for (const file of files) {
    const before = cpuNow()
    await tap.test(file, { timeout: fileLimitMs }, async (t) => {
      runFileOn(t)
      await import(pathToFileURL(join(ROOT, file)).href)
    })
    // HOOKQ_TEST_CPU_LOG: a line for each file too, marked with its group (scripts/test-cpu.mjs).
    if (cpuLog) logCpu(cpuLog, file, before, cpuNow(), group)
  }
  runFileOn(tap)
}

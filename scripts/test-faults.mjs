// `npm run test:faults`: the test files that are slow by nature, which `npm test` leaves out: the
// fault-injection scenarios (test/faults) and the multi-process soaks (several broker processes,
// SIGKILLs under load, load past capacity), and the request fuzzing with its full count of cases. They are package.json's `tap.exclude` list, the one
// place that names them, run here by tap with the same settings as `npm test`. Arguments go to tap
// (`npm run test:faults -- --reporter=terse`). HOOKQ_FAULTS_PROFILE=long runs the long fault profile.
// Like every server test they need DATABASE_URL (a PostgreSQL server), and say so when skipped.
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
// The request fuzzing runs in `npm test` too, with fewer cases a route; here with the full count.
const FUZZ = 'test/security/fuzz.test.ts'
const files = [...JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).tap.exclude, FUZZ]
const tap = fileURLToPath(new URL('../node_modules/tap/dist/esm/run.mjs', import.meta.url))
// Each file's limit (tap's --timeout, in seconds) only ends a file that hangs: every wait inside
// has its own limit (a broker's start 150 s, START_LIMIT_MS), and these files start several brokers
// each. package.json's 180 s, the fast files' limit, killed key-order-restart at 186 s in a correct
// run on a loaded machine (load 12-21 on 2 cores; its first test alone took 108 s). A later
// argument (`-- --timeout=N`) still wins; faults.test.ts sets its own.
const FILE_LIMIT_S = 1200
const env = { ...process.env, HOOKQ_FUZZ_RUNS: process.env.HOOKQ_FUZZ_RUNS ?? '200' }
const run = spawnSync(process.execPath, [tap, `--timeout=${FILE_LIMIT_S}`, ...files, ...process.argv.slice(2)], {
  stdio: 'inherit',
  cwd: root,
  env,
})
process.exit(run.status ?? 1)

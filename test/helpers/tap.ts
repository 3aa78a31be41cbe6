/**
 * The `t` a test file writes its tests on: `import t from '../helpers/tap.ts'`, not from 'tap'.
 * A file run alone (`npx tap test/http/topics.test.ts`) gets tap's root test. A file run by a group
 * (test/helpers/group.ts: several files in one process, so that Node's, tap's and the broker
 * modules' start is paid once for them) gets the subtest the group opened for it: its teardowns,
 * hooks and `t.jobs` stay its own, and its brokers close when the file ends, not the process.
 * A live binding: the group sets it before it imports the file, and the file runs to its end
 * before the group imports the next.
 */
import tap, { type Test } from 'tap'

let current: Test = tap
export { current as default }

/** For the group runner: the test that the next file imported writes on. */
export function runFileOn(test: Test): void {
  current = test
}

/** Whether the file running is one of a group's (so what it leaves may serve the group's next file). */
export function inGroup(): boolean {
  return current !== tap
}

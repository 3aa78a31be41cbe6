// How the suite's files are run (test/helpers/group.ts): every file of a test folder is run by
// exactly one group or by `npm run test:faults`, and can be scoped by its group.
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { filesOf, groupedFiles } from './helpers/group.ts'

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
const slow: string[] = pkg.tap.exclude
const entries = readdirSync(new URL('./groups/', import.meta.url))
  .filter((n) => n.endsWith('.test.ts'))
  .map((n) => new URL(`./groups/${n}`, import.meta.url).href)

t.test('every test file runs once: in one group, or in test:faults', async (t) => {
  const root = fileURLToPath(new URL('..', import.meta.url))
  // tap runs test/*.test.ts and the groups (package.json's tap.include); a file one level further
  // down is grouped; one deeper would run nowhere.
  const inFolders = readdirSync(join(root, 'test'), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.test.ts'))
    .map((e) => relative(root, join(e.parentPath, e.name)))
    .filter((f) => f.split('/').length > 2 && !f.startsWith('test/groups/'))
    .sort()
  const grouped = entries.flatMap((e) => filesOf(e))
  t.same([...grouped].sort(), groupedFiles(), 'the groups deal out every grouped file')
  t.equal(new Set(grouped).size, grouped.length, 'no file is in two groups')
  t.same([...grouped, ...slow].sort(), inFolders, 'a file below test/ is grouped or slow, never neither')
  for (const f of slow) t.ok(existsSync(new URL(`../${f}`, import.meta.url)), `${f} (tap.exclude) exists`)
  t.ok(entries.length >= 4, 'at least as many groups as tap runs at a time')
})

t.test("grouped files write on the group's test, not tap's root", async (t) => {
  for (const f of groupedFiles()) {
    const text = readFileSync(new URL(`../${f}`, import.meta.url), 'utf8')
    t.notMatch(text, /^import t\b[^;\n]*from 'tap'/m, `${f}: import t from '../helpers/tap.ts'`)
  }
})

/**
 * The test databases (test/helpers/db.ts): a failed test's database is kept, with its name and a
 * psql command on stderr, and a passed test's is dropped; databases created more than KEEP_HOURS
 * ago are dropped when a test process starts, younger ones and names of other forms are not.
 */
import t from '../helpers/tap.ts'
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { createdAt, databaseServerUrl, KEEP_HOURS, needsServer, withDatabase } from '../helpers/db.ts'

const root = fileURLToPath(new URL('../../', import.meta.url))

/** Runs `sql` on the server's maintenance database. */
async function admin(sql: string) {
  const c = new pg.Client({ connectionString: withDatabase(databaseServerUrl!, 'postgres') })
  await c.connect()
  try {
    return (await c.query(sql)).rows
  } finally {
    await c.end()
  }
}
const exists = async (name: string) => (await admin(`SELECT 1 FROM pg_database WHERE datname = '${name}'`)).length === 1
const drop = (name: string) => admin(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
const hex = () => randomBytes(6).toString('hex')
const stamp = (msAgo: number) => new Date(Date.now() - msAgo).toISOString().replace(/\D/g, '').slice(0, 14)

t.test('names carry their creation time', async (t) => {
  t.same(createdAt('hookq_t_20261201070001_0123456789ab'), new Date('2026-12-01T07:00:01Z'))
  t.equal(createdAt('hookq_t_0123456789ab'), undefined, 'a name of the old form has no time')
  t.equal(createdAt('hookq_tpl_0123456789abcdef'), undefined)
})

t.test('a failed test keeps its database and says where; a passed one drops it; old ones are pruned', { skip: needsServer }, async (t) => {
  const hour = 3_600_000
  const old = `hookq_t_${stamp((KEEP_HOURS + 1) * hour)}_${hex()}`
  const young = `hookq_t_${stamp((KEEP_HOURS - 1) * hour)}_${hex()}`
  const otherForm = `hookq_t_${hex()}` // what a checkout without this rule names its databases, maybe in use
  for (const name of [old, young, otherForm]) {
    await admin(`CREATE DATABASE "${name}" TEMPLATE template0`)
    t.teardown(() => drop(name))
  }

  // A clean environment: the fixture runs as a test file of its own, not as a child of this run.
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/fixtures/kept-database.ts'], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', DATABASE_URL: databaseServerUrl! },
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (d) => {
    stdout += d
  })
  child.stderr.on('data', (d) => {
    stderr += d
  })
  const code = await new Promise((resolve) => child.on('exit', resolve))
  const dbOf = (outcome: string) => new RegExp(`# database of ${outcome}: (hookq_t_\\w+)`).exec(stdout)?.[1]
  const [passed, failed] = [dbOf('passes'), dbOf('fails')]
  if (failed) t.teardown(() => drop(failed))
  t.equal(code, 1, 'the fixture failed')
  t.ok(passed && failed, `both subtests said their database: ${stdout}`)

  t.notOk(await exists(passed!), "the passed subtest's database is dropped")
  t.ok(await exists(failed!), "the failed subtest's database is kept")
  t.match(stderr, `# test/support/fixtures/kept-database.ts > fails failed: its database is kept for inspection\n`)
  t.match(stderr, `#   psql '${withDatabase(databaseServerUrl!, failed!)}'\n`, 'with a psql command to open it')
  t.match(stderr, `(or now: DROP DATABASE "${failed}")`)
  const c = new pg.Client({ connectionString: withDatabase(databaseServerUrl!, failed!) })
  await c.connect()
  t.same((await c.query('SELECT what FROM evidence')).rows, [{ what: 'left by the subtest that fails' }], 'as the test left it')
  await c.end()
  const [{ comment }] = await admin(`SELECT shobj_description(oid, 'pg_database') AS comment FROM pg_database WHERE datname = '${failed}'`)
  t.match(comment, /^kept: test\/support\/fixtures\/kept-database\.ts > fails failed at \d{4}-/, 'its comment says whose it is')

  t.notOk(await exists(old), `a database created ${KEEP_HOURS + 1} h ago is dropped when a test process starts`)
  t.ok(await exists(young), `one created ${KEEP_HOURS - 1} h ago is not`)
  t.ok(await exists(otherForm), 'nor one whose name has no time')
})

/**
 * `hookq keys create|list|delete` against a real broker, and the CLI with a scoped key: lists show
 * what the key may see, a call outside its scopes is a clear 403 (exit 1), never a crash, and no
 * output but create's shows a key.
 */
import t from '../helpers/tap.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { runCli } from './run.ts'

const ROOT = 'root-key-of-the-cli-test'
const { url } = await startListeningBroker(t, { HOOKQ_API_KEYS: ROOT })
const as = (key: string, ...args: string[]) => runCli(['--api-key', key, ...args], { url })

t.test('keys create, list and delete; a scoped key in the other commands', async (t) => {
  // Commands that do not depend on each other run at once: each is a Node process of its own.
  for (const created of await Promise.all(
    ['orders', 'orders.eu', 'billing'].map((topic) => as(ROOT, 'topics', 'create', topic, '-p', '1')),
  )) {
    t.equal(created.code, 0)
  }

  const made = await as(ROOT, 'keys', 'create', 'orders-service', '--scope', 'produce:topics=orders*', '-s', 'consume:groups=billing-g')
  t.equal(made.code, 0, made.stderr)
  const key = made.stdout.trim()
  t.match(key, /^hq_[A-Za-z0-9_-]{43}$/, 'stdout is the key alone, for scripts')
  t.match(made.stderr, /created key [0-9a-f-]{36} \(orders-service\): produce\(topics=orders\*\) consume\(groups=billing-g\)/)
  t.match(made.stderr, /shown this once/)
  const id = /created key ([0-9a-f-]{36})/.exec(made.stderr)![1]!

  const [list, listedJson] = await Promise.all([as(ROOT, 'keys', 'list'), as(ROOT, '--json', 'keys', 'list')])
  t.equal(list.code, 0)
  t.match(list.stdout, /^ID\s+NAME\s+SCOPES\s+CREATED\s+EXPIRES$/m)
  t.match(
    list.stdout,
    new RegExp(`^${id}\\s+orders-service\\s+produce\\(topics=orders\\*\\) consume\\(groups=billing-g\\)\\s+\\d{4}-.*\\s+-$`, 'm'),
  )
  t.notOk(list.stdout.includes(key.slice(3)) || list.stderr.includes(key.slice(3)), 'list never prints the key')
  const listed = JSON.parse(listedJson.stdout)
  t.notOk(JSON.stringify(listed).includes(key.slice(3)), 'nor with --json')

  // Reads, and calls refused before they change anything: independent of each other.
  const [topics, refused, notAllowed, bad, badWord] = await Promise.all([
    as(key, 'topics', 'list'),
    as(key, 'topics', 'delete', 'billing'),
    as(key, 'keys', 'list'),
    as(ROOT, 'keys', 'create', 'x', '--scope', 'produce:groups=g'),
    as(ROOT, 'keys', 'create', 'x', '--scope', 'write'),
  ])
  t.equal(topics.code, 0, topics.stderr)
  t.match(topics.stdout, /^orders\s/m)
  t.match(topics.stdout, /^orders\.eu\s/m)
  t.notMatch(topics.stdout, /^billing/m, 'the scoped key sees its topics only')

  t.equal(refused.code, 1, 'a broker error, not a crash')
  t.match(
    refused.stderr,
    /hookq: forbidden \(HTTP 403\): this API key needs admin for DELETE \/v1\/topics\/:topic \(it has produce\(topics=orders\*\)/,
  )
  t.match(refused.stderr, /scopes do not cover this call/)
  t.notMatch(refused.stderr, /unexpected error|at .*\.ts:/)
  t.notOk(refused.stderr.includes(key.slice(3)), 'no output quotes the key')

  t.equal(notAllowed.code, 1)
  t.match(notAllowed.stderr, /needs admin \(without topics or groups\)/)

  t.equal(bad.code, 2, 'a scope the broker would refuse is a usage error here')
  t.match(bad.stderr, /produce scope takes topics, not groups/)
  t.equal(badWord.code, 2)

  const deleted = await as(ROOT, 'keys', 'delete', id)
  t.equal(deleted.code, 0)
  t.equal(deleted.stdout.trim(), `deleted: key ${id}`)
  const gone = await as(key, 'topics', 'list')
  t.equal(gone.code, 1)
  t.match(gone.stderr, /unauthorized \(HTTP 401\)/)
  t.equal((await as(ROOT, 'keys', 'delete', id)).code, 1, 'deleting it again: 404')
})

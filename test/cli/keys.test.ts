/**
 * `hookq keys create|list|delete` against a real broker, and the CLI with a scoped key: lists show
 * what the key may see, a call outside its scopes is a clear 403 (exit 1), never a crash, and no
 * output but create's shows a key.
 */
import t from 'tap'
import { startListeningBroker } from '../helpers/broker.ts'
import { runCli } from './run.ts'

const ROOT = 'root-key-of-the-cli-test'
const { url } = await startListeningBroker(t, { HOOKQ_API_KEYS: ROOT })
const as = (key: string, ...args: string[]) => runCli(['--api-key', key, ...args], { url })

t.test('keys create, list and delete; a scoped key in the other commands', async (t) => {
  for (const topic of ['orders', 'orders.eu', 'billing']) t.equal((await as(ROOT, 'topics', 'create', topic, '-p', '1')).code, 0)

  const made = await as(ROOT, 'keys', 'create', 'orders-service', '--scope', 'produce:topics=orders*', '-s', 'consume:groups=billing-g')
  t.equal(made.code, 0, made.stderr)
  const key = made.stdout.trim()
  t.match(key, /^hq_[A-Za-z0-9_-]{43}$/, 'stdout is the key alone, for scripts')
  t.match(made.stderr, /created key [0-9a-f-]{36} \(orders-service\): produce\(topics=orders\*\) consume\(groups=billing-g\)/)
  t.match(made.stderr, /shown this once/)
  const id = /created key ([0-9a-f-]{36})/.exec(made.stderr)![1]!

  const list = await as(ROOT, 'keys', 'list')
  t.equal(list.code, 0)
  t.match(list.stdout, /^ID\s+NAME\s+SCOPES\s+CREATED\s+EXPIRES$/m)
  t.match(
    list.stdout,
    new RegExp(`^${id}\\s+orders-service\\s+produce\\(topics=orders\\*\\) consume\\(groups=billing-g\\)\\s+\\d{4}-.*\\s+-$`, 'm'),
  )
  t.notOk(list.stdout.includes(key.slice(3)) || list.stderr.includes(key.slice(3)), 'list never prints the key')
  const listed = JSON.parse((await as(ROOT, '--json', 'keys', 'list')).stdout)
  t.notOk(JSON.stringify(listed).includes(key.slice(3)), 'nor with --json')

  const topics = await as(key, 'topics', 'list')
  t.equal(topics.code, 0, topics.stderr)
  t.match(topics.stdout, /^orders\s/m)
  t.match(topics.stdout, /^orders\.eu\s/m)
  t.notMatch(topics.stdout, /^billing/m, 'the scoped key sees its topics only')

  const refused = await as(key, 'topics', 'delete', 'billing')
  t.equal(refused.code, 1, 'a broker error, not a crash')
  t.match(
    refused.stderr,
    /hookq: forbidden \(HTTP 403\): this API key needs admin for DELETE \/v1\/topics\/:topic \(it has produce\(topics=orders\*\)/,
  )
  t.match(refused.stderr, /scopes do not cover this call/)
  t.notMatch(refused.stderr, /unexpected error|at .*\.ts:/)
  t.notOk(refused.stderr.includes(key.slice(3)), 'no output quotes the key')

  const notAllowed = await as(key, 'keys', 'list')
  t.equal(notAllowed.code, 1)
  t.match(notAllowed.stderr, /needs admin \(without topics or groups\)/)

  const bad = await as(ROOT, 'keys', 'create', 'x', '--scope', 'produce:groups=g')
  t.equal(bad.code, 2, 'a scope the broker would refuse is a usage error here')
  t.match(bad.stderr, /produce scope takes topics, not groups/)
  t.equal((await as(ROOT, 'keys', 'create', 'x', '--scope', 'write')).code, 2)

  const deleted = await as(ROOT, 'keys', 'delete', id)
  t.equal(deleted.code, 0)
  t.equal(deleted.stdout.trim(), `deleted: key ${id}`)
  const gone = await as(key, 'topics', 'list')
  t.equal(gone.code, 1)
  t.match(gone.stderr, /unauthorized \(HTTP 401\)/)
  t.equal((await as(ROOT, 'keys', 'delete', id)).code, 1, 'deleting it again: 404')
})

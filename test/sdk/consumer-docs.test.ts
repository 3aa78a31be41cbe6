/**
 * docs/consumer-helper.md's shell blocks as a reader pastes them, from a fresh start: each makes its
 * own topic and group, registers the example consumer with a secret of its own, starts it, and
 * produces; every message it produces must reach the example and be handled. Only the addresses are
 * the test's (a broker on a free port, the consumer on another, the consumer's own database).
 */
import t from '../helpers/tap.ts'
import { startListeningBroker } from '../helpers/broker.ts'
import { needsServer } from '../helpers/db.ts'
import { consumerDatabase, sdkApi } from '../helpers/sdk.ts'
import { freePort, runShell, shellBlock, swapped } from '../helpers/shell.ts'
import { waitUntil } from '../helpers/wait.ts'

const PAGE = 'docs/consumer-helper.md'
const { url } = await startListeningBroker(t)
const { lagZero, deliveries } = sdkApi(url)

t.test("the complete consumer's block: its own topic and group, and the order it produces handled", async (t) => {
  const block = await shellBlock(PAGE, 'sh: examples/consumer.mjs')
  const script = swapped(block, [
    ['http://127.0.0.1:8080', url],
    ['PORT=3000', `PORT=${await freePort()}`],
  ])
  const run = runShell(t, script)
  const exit = await new Promise<number | null>((resolve) => run.child.on('exit', resolve))
  t.equal(exit, 0, `the block runs to its end: ${run.output()}`)

  await waitUntil(() => run.output().includes('order {"id":"o-1","total":42.5}'), 30_000, `the order printed: ${run.output()}`)
  await lagZero('order-recorder')
  const log = await deliveries('order-recorder')
  t.ok(
    log.some((d) => d.outcome === 'acked'),
    'acked by the consumer',
  )
  t.notOk(
    log.some((d) => d.outcome !== 'acked' && d.statusCode !== null && d.statusCode !== 200 && d.statusCode >= 400),
    'no attempt refused by the consumer (a bad secret or shape)',
  )
})

t.test("the exactly-once consumer's block: its own topic and group, and each payment counted once", { skip: needsServer }, async (t) => {
  const db = await consumerDatabase(t, 'unused int')
  const block = await shellBlock(PAGE, 'sh: examples/consumer-exactly-once.mjs')
  const script = swapped(block, [
    ['http://127.0.0.1:8080', url],
    ['PORT=3001', `PORT=${await freePort()}`],
    ['postgresql://127.0.0.1:5432/shop', db.url],
  ])
  const run = runShell(t, script)
  const exit = await new Promise<number | null>((resolve) => run.child.on('exit', resolve))
  t.equal(exit, 0, `the block runs to its end: ${run.output()}`)

  await lagZero('balances')
  t.same(
    await db.rows('SELECT account, cents::int FROM balances ORDER BY account'),
    [
      { account: 'a', cents: 350 },
      { account: 'b', cents: 5 },
    ],
    'each payment counted once',
  )
  t.notOk(
    (await deliveries('balances')).some((d) => d.statusCode !== null && d.statusCode >= 400),
    `no attempt failed in the consumer: ${run.output()}`,
  )
})

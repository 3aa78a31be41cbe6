/**
 * The README's first screen as a newcomer pastes it: the "Hello, webhook" block run by bash against
 * a real broker, with the receiver it starts in the background; the push must arrive and be acked.
 * Only the addresses are the test's own (a broker on a free port instead of 8080, the receiver on
 * another instead of 9000).
 */
import t from 'tap'
import { startListeningBroker } from './helpers/broker.ts'
import { freePort, runShell, shellBlock, swapped } from './helpers/shell.ts'
import { waitUntil } from './helpers/wait.ts'

t.test("the README's hello-webhook: a topic, a group, a receiver, a produce, and the push printed", async (t) => {
  const { url } = await startListeningBroker(t)
  const block = await shellBlock('README.md', 'hello-webhook')
  const receiverPort = String(await freePort())
  const script = swapped(block, [
    ['9000', receiverPort],
    ['http://127.0.0.1:8080', url],
  ])
  const run = runShell(t, script)
  const exit = await new Promise<number | null>((resolve) => run.child.on('exit', resolve))
  t.equal(exit, 0, `the block runs to its end: ${run.output()}`)
  t.match(run.output(), /\{"results":\[\{"partition":0,"offset":0\}\]\}/, 'the produce is answered with its offset')

  const line = await waitUntil(() => /^push: (.*)$/m.exec(run.output())?.[1], 30_000, `the push printed: ${run.output()}`)
  t.match(JSON.parse(line), { topic: 'hello', group: 'hello-receiver', partition: 0, offset: 0, value: { hello: 'webhook' }, attempt: 1 })

  // auto ack mode: the receiver's 200 was the ack, so the group has nothing left
  await waitUntil(
    async () => {
      const group = (await (await fetch(`${url}/v1/groups/hello-receiver`)).json()) as { partitions: { lag: number; inFlight: number }[] }
      return group.partitions.every((p) => p.lag === 0 && p.inFlight === 0)
    },
    30_000,
    'the push acked',
  )
  t.pass('acked by the 200 answer')
})

/**
 * What the console's pages say, from the plain functions they draw with (the browser test,
 * test/console/console.test.ts, drives the pages themselves): dead letters counted for the group
 * that dead-lettered them, delivery ids told apart, consumers counted once, and a lag chart with
 * whole-message ticks and ISO dates.
 */
import t from '../helpers/tap.ts'
import { newDeliveryId } from '../../src/core/delivery-id.ts'
// @ts-expect-error: plain browser JavaScript without declarations (checked by tsc -p src/console)
import { deadLetterCounts } from '../../src/console/deadletters.js'
// @ts-expect-error: as above
import { COUNT_STEPS, fmtBytes, idLabel, timeTickLabels } from '../../src/console/dom.js'
// @ts-expect-error: as above
import { consumerSummary } from '../../src/console/groups.js'
// @ts-expect-error: as above
import { storageLine } from '../../src/console/topic.js'

const dead = (group: string) => ({ headers: { 'hookq-dlq-topic': 'orders', 'hookq-dlq-group': group } })

t.test('the Dead letters index counts for each group only what it dead-lettered', async (t) => {
  // Two groups share orders.dlq; billing dead-lettered 3, audit none; a third group has its own topic.
  const groups = [
    { name: 'billing', deadLetterTopic: 'orders.dlq' },
    { name: 'audit', deadLetterTopic: 'orders.dlq' },
    { name: 'ship', deadLetterTopic: 'ship.dlq' },
  ]
  const read = new Map([
    ['orders.dlq', { messages: [dead('billing'), dead('billing'), dead('billing'), { headers: {} }], complete: true }],
    ['ship.dlq', { messages: [dead('ship')], complete: false }],
  ])
  t.same(deadLetterCounts(groups, read), [
    { count: 3, complete: true },
    { count: 0, complete: true },
    { count: 1, complete: false },
  ])
})

t.test("the delivery log's id column tells a partition's deliveries apart", async (t) => {
  const ids = Array.from({ length: 20 }, (_, offset) => newDeliveryId({ groupId: 7, partition: 0, offset, attempt: 1 }))
  t.equal(new Set(ids.map((id) => id.slice(0, 8))).size, 1, 'their first 8 characters are alike (what the column showed)')
  const labels: string[] = ids.map(idLabel)
  t.equal(new Set(labels).size, ids.length, `every label differs: ${labels.slice(0, 3).join(' ')}`)
  for (const [i, label] of labels.entries()) {
    t.ok(label.length <= 11 && ids[i]!.endsWith(label.split('…')[1]!), `${label} is the id's head and tail`)
  }
  t.equal(idLabel('short-id'), 'short-id', 'a short id whole')
})

t.test('consumers are counted once: one failing consumer is "1 consumer, failing"', async (t) => {
  const ok = { disabled: false, health: { recentFailureRate: 0 } }
  const failing = { disabled: false, health: { recentFailureRate: 1 } }
  const gone = { disabled: true, health: { recentFailureRate: null } }
  t.same(consumerSummary([]), { text: 'no consumer', tone: 'warn' })
  t.same(consumerSummary([ok]), { text: '1 consumer', tone: 'ok' })
  t.same(consumerSummary([failing]), { text: '1 consumer, failing', tone: 'bad' })
  t.same(consumerSummary([gone]), { text: '1 consumer, disabled', tone: 'bad' })
  t.same(consumerSummary([ok, ok]), { text: '2 consumers', tone: 'ok' })
  t.same(consumerSummary([ok, failing, gone]), { text: '3 consumers: 1 ok, 1 failing, 1 disabled', tone: 'warn' })
  t.same(consumerSummary([failing, failing]), { text: '2 consumers: 2 failing', tone: 'bad' })
})

t.test('the lag chart: whole-message ticks, and dates as the rest of the console writes them', async (t) => {
  t.ok(
    COUNT_STEPS.every((s: number) => Number.isInteger(s)),
    'every lag tick step is a whole number',
  )
  t.equal(COUNT_STEPS[0], 1, 'the smallest step is one message')
  t.ok(COUNT_STEPS.at(-1) >= 1e12, 'and they reach any lag')

  const start = Date.UTC(2026, 11, 6, 3, 45, 0) / 1000
  const labels: string[] = timeTickLabels([start, start + 60, start + 120], 60)
  const local = new Date(start * 1000)
  const day = [local.getFullYear(), local.getMonth() + 1, local.getDate()].map((n) => String(n).padStart(2, '0')).join('-')
  t.match(labels[0], new RegExp(`^\\d\\d:\\d\\d\\n${day}$`), `the first tick carries the ISO date: ${JSON.stringify(labels)}`)
  t.match(labels[1], /^\d\d:\d\d$/, 'the next ones the time only, 24-hour')
  t.notMatch(labels.join(' '), /\d+\/\d+|am|pm/i, 'no US date or am/pm')
  t.match(timeTickLabels([start + 5], 5)[0], /^\d\d:\d\d:\d\d\n/, 'seconds when the steps are shorter than a minute')
})

t.test("a topic's storage line: messages kept, the oldest one, and its disk in binary units", async (t) => {
  t.same([0, 512, 1536, 10_485_760, 3 * 2 ** 30].map(fmtBytes), ['0 B', '512 B', '1.5 KiB', '10 MiB', '3.0 GiB'])
  t.equal(storageLine({ messages: 0, oldestMessageAt: null, approxBytes: 0 }), 'Keeps 0 messages (none kept) · about 0 B on disk')
  t.match(
    storageLine({ messages: 1, oldestMessageAt: '2026-01-31T14:05:09Z', approxBytes: 2_000_000 }),
    /^Keeps 1 message \(oldest 2026-01-3\d \d\d:05:09\) · about 1\.9 MiB on disk$/,
  )
})

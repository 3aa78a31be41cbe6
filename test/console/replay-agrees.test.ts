/**
 * The console replays dead letters in the browser with its own JavaScript; the CLI and SDK with
 * clients/typescript/src/dlq.ts. They must read the hookq-dlq-* headers alike and derive the same
 * idempotency key, or a dead letter replayed from both is stored twice.
 */
import t from '../helpers/tap.ts'
import { deadLetterOrigin, replayIdempotencyKey } from '@hookq/client'
// @ts-expect-error: plain browser JavaScript without declarations (checked by tsc -p src/console)
import { deadLetterInfo, replayKey } from '../../src/console/replay.js'

const cases: Record<string, string>[] = [
  {
    'hookq-dlq-topic': 'orders',
    'hookq-dlq-partition': '3',
    'hookq-dlq-offset': '41',
    'hookq-dlq-group': 'g',
    'hookq-dlq-attempts': '5',
    'hookq-dlq-error': 'HTTP 500',
  },
  { 'hookq-dlq-topic': '', 'hookq-dlq-partition': '0', 'hookq-dlq-offset': '0' },
  { 'hookq-dlq-topic': 'orders', 'hookq-dlq-partition': '', 'hookq-dlq-offset': '1e2' },
  { 'hookq-dlq-topic': 'orders', 'hookq-dlq-partition': '-1', 'hookq-dlq-offset': '7.5' },
  { trace: 'x' },
]

t.test('the console and the SDK read dead-letter headers alike', async (t) => {
  for (const headers of cases) {
    const sdk = deadLetterOrigin({ headers })
    const console = deadLetterInfo(headers)
    t.equal(console.topic, sdk?.topic ?? null, `topic of ${JSON.stringify(headers)}`)
    // Without a topic neither replays it; with one, both place it alike.
    if (sdk) {
      t.equal(console.partition, sdk.partition ?? null, 'partition')
      t.equal(console.offset, sdk.offset ?? null, 'offset')
    }
  }
})

t.test('the console and the SDK derive the same replay idempotency key', async (t) => {
  const createdAt = '2026-12-01T03:06:43.177Z'
  for (const [dlq, p, o] of [
    ['orders.dlq', 0, 0],
    ['a.b-c_d', 7, 123456789],
  ] as const) {
    t.equal(replayKey(dlq, createdAt, p, o), replayIdempotencyKey(dlq, createdAt, p, o))
  }
})

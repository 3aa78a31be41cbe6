/**
 * The push body as it goes on the wire: the envelope is valid JSON carrying the message's stored
 * JSON text as it is, and the cached ISO formatter writes what Date#toISOString writes.
 */
import t from '../helpers/tap.ts'
import { buildEnvelope, isoFormatter } from '../../src/dispatch/envelope.ts'
import type { DispatchMessage } from '../../src/core/dispatch-message.ts'
import { mulberry32 } from '../helpers/prng.ts'

t.test('isoFormatter writes what toISOString writes, across seconds, days and out-of-range years', async (t) => {
  const iso = isoFormatter()
  const random = mulberry32(7)
  const base = Date.UTC(2026, 11, 31, 23, 59, 59, 0)
  const values = [
    0,
    1,
    9,
    10,
    99,
    100,
    999,
    1000,
    base,
    base + 1,
    base + 999,
    base + 1000,
    base + 1001,
    -1,
    -1000,
    -86_400_001,
    253_402_300_799_999,
    253_402_300_800_000,
    8.64e15,
    1_700_000_000_123.7,
  ]
  for (let i = 0; i < 2000; i++) values.push(Math.floor(base + (random() - 0.5) * 4e9))
  // The same second over and over (the cache), then back and forth between two.
  for (let i = 0; i < 50; i++) values.push(base + i, base - 1000 + i)
  const wrong = values.filter((ms) => iso(ms) !== new Date(ms).toISOString())
  t.same(wrong, [], 'every value formatted as toISOString formats it')
})

t.test('an envelope is JSON with the value and headers spliced in as stored', async (t) => {
  const target = { groupName: 'g', topicName: 'orders', topicId: 3, partition: 2, pushFormat: 'envelope' as const, consumerSecrets: [] }
  const producedAtMs = Date.UTC(2026, 0, 2, 3, 4, 5, 6)
  const msg: DispatchMessage = {
    offset: 41,
    key: 'k"\u2028',
    value: '{"a":[1,"\\u0000"],"z":null}',
    headers: '{"h":"v"}',
    producedAtMs,
    availableAtMs: producedAtMs,
    traceId: '0af7651916cd43dd8448eb211c80319c',
    traceparent: null,
    tracestate: 'congo=t61rcWkgMzE,rojo="x\\y"',
  }
  const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
  const text = buildEnvelope(target, msg, 'd1', 3, Date.UTC(2026, 0, 2, 3, 4, 35, 60), traceparent)
  t.same(JSON.parse(text), {
    deliveryId: 'd1',
    topic: 'orders',
    group: 'g',
    partition: 2,
    offset: 41,
    key: 'k"\u2028',
    value: { a: [1, '\u0000'], z: null },
    headers: { h: 'v' },
    attempt: 3,
    timestamp: '2026-01-02T03:04:05.006Z',
    ackDeadline: '2026-01-02T03:04:35.060Z',
    traceparent,
    tracestate: 'congo=t61rcWkgMzE,rojo="x\\y"',
  })
  t.ok(text.includes('"value":{"a":[1,"\\u0000"],"z":null}'), 'the stored JSON text is not re-serialised')
})

/** W3C Trace Context parsing and the traces messages get (src/core/trace-context.ts). */
import t from '../helpers/tap.ts'
import {
  attemptTraceparent,
  callTrace,
  type MessageTrace,
  messageTrace,
  newSpanId,
  newTraceId,
  parseTraceparent,
  parseTracestate,
  traceOfHeaderText,
} from '../../src/core/trace-context.ts'

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736'
const VALID = `00-${TRACE}-00f067aa0ba902b7-01`

t.test('traceparent: version 00 as W3C writes it; anything else is ignored', async (t) => {
  t.equal(parseTraceparent(VALID), VALID)
  t.equal(parseTraceparent(`00-${TRACE}-00f067aa0ba902b7-00`), `00-${TRACE}-00f067aa0ba902b7-00`, 'not sampled is still valid')
  const invalid = {
    'upper-case hex': VALID.toUpperCase(),
    'all-zero trace id': `00-${'0'.repeat(32)}-00f067aa0ba902b7-01`,
    'all-zero span id': `00-${TRACE}-${'0'.repeat(16)}-01`,
    'version ff': `ff-${TRACE}-00f067aa0ba902b7-01`,
    'version 00 with more after it': `${VALID}-extra`,
    'a short trace id': `00-${TRACE.slice(1)}-00f067aa0ba902b7-01`,
    'not hex': `00-${TRACE.slice(0, 31)}g-00f067aa0ba902b7-01`,
    'two headers joined': `${VALID}, ${VALID}`,
    empty: '',
    'not a string': 42,
  }
  for (const [why, value] of Object.entries(invalid)) t.equal(parseTraceparent(value), null, why)
})

t.test('traceparent: a later version is read by its first fields and written as 00', async (t) => {
  t.equal(parseTraceparent(`01-${TRACE}-00f067aa0ba902b7-03-whatever`), `00-${TRACE}-00f067aa0ba902b7-01`)
  t.equal(parseTraceparent(`cc-${TRACE}-00f067aa0ba902b7-02`), `00-${TRACE}-00f067aa0ba902b7-00`)
  t.equal(parseTraceparent(`01-${TRACE}-00f067aa0ba902b7-01x`), null, 'the flags must end the value or be followed by a dash')
})

t.test('tracestate: valid lists kept (joined when repeated), invalid ones dropped whole', async (t) => {
  t.equal(parseTracestate('congo=t61rcWkgMzE, rojo=00f067aa0ba902b7'), 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7')
  t.equal(parseTracestate(['a=1', 'b@sys=2']), 'a=1,b@sys=2', 'several headers are one list')
  t.equal(parseTracestate('a=1,,b=2'), 'a=1,b=2', 'empty members are skipped')
  t.equal(parseTracestate('Upper=1'), null, 'keys are lower case')
  t.equal(parseTracestate('a=1\u0000'), null, 'control characters refused')
  t.equal(parseTracestate('a=b=c'), null, 'no "=" in a value')
  t.equal(parseTracestate(Array.from({ length: 33 }, (_, i) => `k${i}=v`).join(',')), null, 'at most 32 members')
  t.equal(parseTracestate(`a=${'x'.repeat(255)},b=${'y'.repeat(255)},c=${'z'.repeat(10)}`), null, 'at most 512 characters')
  t.equal(parseTracestate(''), null)
  t.equal(parseTracestate(undefined), null)
})

t.test("a message's own header wins over the call's; an invalid one falls back; none gets a new trace", async (t) => {
  const call = callTrace({ traceparent: VALID, tracestate: 'call=1' })
  t.same(call, { traceparent: VALID, tracestate: 'call=1' })
  t.equal(callTrace({ traceparent: 'nonsense', tracestate: 'call=1' }), null, 'an invalid call traceparent is ignored')
  const into: MessageTrace = { traceId: '', traceparent: null, tracestate: null }
  const own = `00-${'a'.repeat(32)}-${'b'.repeat(16)}-00`
  messageTrace({ traceparent: own, tracestate: 'own=1' }, call, into)
  t.same(into, { traceId: 'a'.repeat(32), traceparent: own, tracestate: 'own=1' }, 'its own, with its own tracestate')
  messageTrace({ traceparent: 'bad', tracestate: 'own=1' }, call, into)
  t.same(into, { traceId: TRACE, traceparent: VALID, tracestate: 'call=1' }, "an invalid own traceparent: the call's context")
  messageTrace(undefined, null, into)
  t.match(into.traceId, /^[0-9a-f]{32}$/)
  t.equal(into.traceparent, null)
  const first = into.traceId
  messageTrace({}, null, into)
  t.not(into.traceId, first, 'each message without one gets a trace of its own')
  traceOfHeaderText(JSON.stringify({ x: '1', traceparent: own }), into)
  t.equal(into.traceparent, own, 'stored header text (hookq_produce) is read too')
  traceOfHeaderText('{}', into)
  t.equal(into.traceparent, null)
})

t.test('each attempt: the trace id, a span id of its own, the producer flags (a trace begun here: sampled)', async (t) => {
  t.equal(
    attemptTraceparent({ traceId: TRACE, traceparent: VALID.replace(/-01$/, '-00') }, 'b7ad6b7169203331'),
    `00-${TRACE}-b7ad6b7169203331-00`,
  )
  t.equal(attemptTraceparent({ traceId: TRACE, traceparent: null }, 'b7ad6b7169203331'), `00-${TRACE}-b7ad6b7169203331-01`)
  const spans = new Set(Array.from({ length: 2000 }, () => newSpanId()))
  t.equal(spans.size, 2000, 'span ids do not repeat (across pool refills too)')
  for (const s of spans) if (!/^[0-9a-f]{16}$/.test(s)) t.fail(s)
  t.match(newTraceId(), /^[0-9a-f]{32}$/)
})

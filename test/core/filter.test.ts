/** Filters (contract v1.1 "Filters"): each operator, $or, not, missing paths, and the errors naming the member. */
import t from '../helpers/tap.ts'
import { compileFilter, FilterError } from '../../src/core/filter.ts'

const msg = (value: unknown, headers: Record<string, string> = {}, key: string | null = null) => ({
  key,
  value: JSON.stringify(value),
  headers: JSON.stringify(headers),
})

const matches = (filter: unknown, m: ReturnType<typeof msg>) => compileFilter(filter)(m)

t.test('equality: key, headers, value paths; same type and value', async (t) => {
  const m = msg({ region: 'eu-west', total: 12, paid: true, note: null, n: { deep: { er: 'x' } } }, { type: 'created' }, 'user-7')
  t.ok(matches({ key: 'user-7' }, m))
  t.notOk(matches({ key: 'user-8' }, m))
  t.ok(matches({ 'headers.type': 'created' }, m))
  t.notOk(matches({ 'headers.Type': 'created' }, m), 'header names are exact')
  t.ok(matches({ 'value.region': 'eu-west', 'value.total': 12, 'value.paid': true, 'value.note': null }, m), 'every member (AND)')
  t.notOk(matches({ 'value.region': 'eu-west', 'value.total': 13 }, m), 'one member off: no match')
  t.notOk(matches({ 'value.total': '12' }, m), 'a string is not the number')
  t.ok(matches({ 'value.n.deep.er': 'x' }, m), 'a nested path')
  t.ok(matches({}, m), 'the empty filter matches everything')
})

t.test('arrays, prefix, ranges, exists, not', async (t) => {
  const m = msg({ region: 'eu-west', total: 12 }, { type: 'created' })
  t.ok(matches({ 'headers.type': ['updated', 'created'] }, m))
  t.notOk(matches({ 'headers.type': ['updated', 'deleted'] }, m))
  t.ok(matches({ 'value.region': { prefix: 'eu-' } }, m))
  t.notOk(matches({ 'value.region': { prefix: 'us-' } }, m))
  t.notOk(matches({ 'value.total': { prefix: '1' } }, m), 'prefix is for strings')
  t.ok(matches({ 'value.total': { gte: 12, lt: 100 } }, m))
  t.notOk(matches({ 'value.total': { gt: 12 } }, m))
  t.ok(matches({ 'value.total': { lte: 12 } }, m))
  t.notOk(matches({ 'value.region': { gt: 0 } }, m), 'ranges are for numbers')
  t.ok(matches({ 'value.total': { exists: true }, 'value.missing': { exists: false } }, m))
  t.notOk(matches({ 'value.total': { exists: false } }, m))
  t.ok(matches({ 'value.region': { not: { prefix: 'us-' } } }, m))
  t.notOk(matches({ 'value.region': { not: ['eu-west', 'eu-north'] } }, m))
  t.ok(matches({ 'value.total': { not: { gt: 100 } } }, m))
})

t.test('paths that do not exist match nothing but exists: false', async (t) => {
  const m = msg({ a: { b: 1 }, list: [1, 2], s: 'text' })
  for (const name of ['value.nope', 'value.a.c', 'value.s.length', 'value.list.0', 'headers.nope', 'key']) {
    t.notOk(matches({ [name]: 1 }, m), `${name} = 1`)
    t.notOk(matches({ [name]: { not: 1 } }, m), `${name} not 1`)
    t.notOk(matches({ [name]: { not: { prefix: 'x' } } }, m), `${name} not prefix`)
    t.ok(matches({ [name]: { exists: false } }, m), `${name} exists: false`)
    t.ok(matches({ [name]: { not: { exists: true } } }, m), `${name} not exists: true`)
  }
  t.notOk(matches({ 'value.x': 1 }, msg(7)), 'a value that is not an object has no paths')
  t.notOk(matches({ 'value.x': 1 }, msg([{ x: 1 }])), 'nor does an array')
  t.ok(matches({ key: { exists: true } }, msg(1, {}, 'k')))
})

t.test('$or: any of its filters; nested, and beside other members', async (t) => {
  const f = { 'headers.type': 'created', $or: [{ 'value.region': { prefix: 'eu-' } }, { 'value.total': { gte: 100 } }] }
  t.ok(matches(f, msg({ region: 'eu-1', total: 1 }, { type: 'created' })))
  t.ok(matches(f, msg({ region: 'us-1', total: 100 }, { type: 'created' })))
  t.notOk(matches(f, msg({ region: 'us-1', total: 1 }, { type: 'created' })))
  t.notOk(matches(f, msg({ region: 'eu-1', total: 1 }, { type: 'deleted' })), 'and the other member still')
  t.ok(matches({ $or: [{ $or: [{ key: 'a' }, { key: 'b' }] }, { key: 'c' }] }, msg(1, {}, 'b')))
})

t.test('values with \\u0000 and unusual keys', async (t) => {
  t.ok(matches({ 'value.k': 'a\u0000b' }, msg({ k: 'a\u0000b' })))
  t.ok(matches({ 'headers.x-\u00e9': 'é' }, msg(1, { 'x-\u00e9': 'é' })))
  t.notOk(matches({ 'value.__proto__': { exists: true } }, msg({})), 'no prototype members')
  t.notOk(matches({ 'value.toString': { exists: true } }, msg({})))
})

t.test('a filter that is not well formed is refused, naming the member', async (t) => {
  const cases: [unknown, RegExp][] = [
    [[], /^filter must be an object/],
    ['x', /^filter must be an object/],
    [{ nope: 1 }, /^filter\.nope: a member is "key"/],
    [{ value: 1 }, /^filter\.value: a member is/],
    [{ 'headers.': 1 }, /^filter\.headers\.: a member is/],
    [{ 'value.a..b': 1 }, /^filter\.value\.a\.\.b: a value path/],
    [{ key: { prefix: 1 } }, /^filter\.key\.prefix must be a string/],
    [{ key: { exists: 'yes' } }, /^filter\.key\.exists must be true or false/],
    [{ 'value.n': { gt: '1' } }, /^filter\.value\.n\.gt must be a number/],
    [{ 'value.n': { gt: 1, prefix: 'a' } }, /^filter\.value\.n: one operator per condition/],
    [{ 'value.n': { eq: 1 } }, /^filter\.value\.n: unknown operator "eq"/],
    [{ 'value.n': {} }, /^filter\.value\.n: an empty condition/],
    [{ 'value.n': [] }, /^filter\.value\.n: an array condition/],
    [{ 'value.n': [{ a: 1 }] }, /^filter\.value\.n: an array condition/],
    [{ 'value.n': { not: { nope: 1 } } }, /^filter\.value\.n\.not: unknown operator "nope"/],
    [{ $or: [] }, /^filter\.\$or must be a non-empty array/],
    [{ $or: [{ key: 'a' }, { bad: 1 }] }, /^filter\.\$or\[1\]\.bad: a member is/],
    [{ $or: [{ $or: [{ $or: [{ $or: [{ $or: [{ key: 'a' }] }] }] }] }] }, /nested more than 4 deep/],
    [Object.fromEntries(Array.from({ length: 101 }, (_, i) => [`value.f${i}`, 1])), /at most 100 members/],
  ]
  for (const [filter, expected] of cases) {
    let error: unknown
    try {
      compileFilter(filter)
    } catch (err) {
      error = err
    }
    t.ok(error instanceof FilterError, `refused: ${JSON.stringify(filter).slice(0, 80)}`)
    t.match((error as Error | undefined)?.message, expected)
  }
})

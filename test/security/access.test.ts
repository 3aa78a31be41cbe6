/** The pure rules of scoped API keys: patterns, which scope covers which call, scope validation, URL redaction. */
import t from '../helpers/tap.ts'
import {
  covers,
  isUnrestrictedAdmin,
  patternError,
  patternMatches,
  scopeCovers,
  scopesError,
  type KeyScope,
} from '../../src/security/access.ts'
import { redactUrl } from '../../src/security/redact-url.ts'

t.test('patterns: a name, or a prefix ending in *', async (t) => {
  t.ok(patternMatches('orders', 'orders'))
  t.notOk(patternMatches('orders', 'orders.eu'), 'a name is not a prefix')
  t.notOk(patternMatches('orders', 'order'))
  t.ok(patternMatches('orders*', 'orders'), 'a prefix matches itself')
  t.ok(patternMatches('orders.*', 'orders.eu'))
  t.notOk(patternMatches('orders.*', 'orders'), 'the dot is part of the prefix')
  t.notOk(patternMatches('orders*', 'billing-orders'), 'a prefix, not a substring')
  t.ok(patternMatches('*', 'anything'))
  t.notOk(patternMatches('ORDERS', 'orders'), 'names are case-sensitive')
  t.equal(patternError('orders.*'), undefined)
  t.equal(patternError('*'), undefined)
  for (const bad of ['', 'or*ders', '*orders', 'orders**', 'a b', 'x/y', 'a'.repeat(250)]) {
    t.match(patternError(bad), /is not a pattern/, JSON.stringify(bad))
  }
})

t.test('which scope covers which call', async (t) => {
  const produceOrders: KeyScope = { action: 'produce', topics: ['orders*'] }
  t.ok(scopeCovers(produceOrders, 'produce', { topics: ['orders'] }))
  t.ok(scopeCovers(produceOrders, 'produce', { topics: ['orders-dlq'] }))
  t.notOk(scopeCovers(produceOrders, 'produce', { topics: ['billing-dlq'] }), 'a dead-letter topic is a topic like any other')
  t.notOk(scopeCovers(produceOrders, 'consume', { topics: ['orders'], group: 'g' }), 'another action')
  t.notOk(scopeCovers(produceOrders, 'produce', {}), 'a call that names no topic is not covered by a scope naming topics')

  const consumeBilling: KeyScope = { action: 'consume', groups: ['billing'] }
  t.ok(scopeCovers(consumeBilling, 'consume', { group: 'billing', topics: ['orders'] }), 'no topics named: every topic')
  t.notOk(scopeCovers(consumeBilling, 'consume', { group: 'shipping', topics: ['orders'] }))
  t.notOk(scopeCovers(consumeBilling, 'produce', { topics: ['orders'] }))

  const consumeOnOrders: KeyScope = { action: 'consume', topics: ['orders'] }
  t.ok(scopeCovers(consumeOnOrders, 'consume', { group: 'any', topics: ['orders'] }), "a group's topic decides")
  t.notOk(scopeCovers(consumeOnOrders, 'consume', { group: 'any', topics: ['billing'] }))
  t.notOk(scopeCovers(consumeOnOrders, 'consume', { group: 'any', topics: ['orders', 'billing'] }), 'every topic touched must match')

  const adminBilling: KeyScope = { action: 'admin', groups: ['billing*'] }
  t.ok(scopeCovers(adminBilling, 'admin', { group: 'billing.eu', topics: ['x'] }))
  t.ok(scopeCovers(adminBilling, 'consume', { group: 'billing', topics: ['x'] }), 'admin covers consume')
  t.notOk(scopeCovers(adminBilling, 'admin', { topics: ['orders'] }), 'a group admin does not administer topics')
  t.notOk(scopeCovers(adminBilling, 'metrics', {}), 'admin does not cover metrics')
  t.notOk(scopeCovers({ action: 'admin' }, 'metrics', {}), 'not even without patterns (the route lets it: isUnrestrictedAdmin)')

  const both: KeyScope = { action: 'admin', topics: ['orders*'], groups: ['billing'] }
  t.ok(scopeCovers(both, 'admin', { group: 'billing', topics: ['orders'] }))
  t.notOk(scopeCovers(both, 'admin', { group: 'billing', topics: ['payments'] }))
  t.notOk(scopeCovers(both, 'admin', { group: 'other', topics: ['orders'] }))

  t.ok(covers([produceOrders, consumeBilling], 'consume', { group: 'billing', topics: ['t'] }), 'any scope of the key')
  t.ok(isUnrestrictedAdmin([produceOrders, { action: 'admin' }]))
  t.notOk(isUnrestrictedAdmin([{ action: 'admin', topics: ['*'] }]), 'an admin with patterns, even *, does not manage keys')
})

t.test('scope validation', async (t) => {
  t.equal(
    scopesError([
      { action: 'produce', topics: ['orders*'] },
      { action: 'consume', groups: ['billing'] },
    ]),
    undefined,
  )
  t.match(scopesError([]), /at least one scope/)
  t.match(scopesError([{ action: 'produce', groups: ['g'] }]), /produce scope takes topics, not groups/)
  t.match(scopesError([{ action: 'metrics', topics: ['t'] }]), /metrics scope takes no topics/)
  t.match(scopesError([{ action: 'consume', groups: [] }]), /leave it out to cover all groups/)
  t.match(scopesError([{ action: 'consume', groups: ['ok', 'not ok'] }]), /scopes\[0\]\.groups: "not ok" is not a pattern/)
  t.match(scopesError([{ action: 'root' as 'admin' }]), /unknown action "root"/)
})

t.test('consumer URLs redacted: userinfo, query values and fragment', async (t) => {
  t.equal(redactUrl('https://hooks.example.com/in'), 'https://hooks.example.com/in', 'nothing to hide')
  t.equal(
    redactUrl('https://user:pa55@hooks.example.com:8443/in?token=abc&x=1#frag'),
    'https://***@hooks.example.com:8443/in?token=***&x=***#***',
  )
  t.equal(redactUrl('http://127.0.0.1:9000/p?sig=a%20b'), 'http://127.0.0.1:9000/p?sig=***')
  t.equal(redactUrl('not a url'), '***')
  t.notMatch(redactUrl('https://u:secretpw@h/?k=secretq'), /secret/)
})

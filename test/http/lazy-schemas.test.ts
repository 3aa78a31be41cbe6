// Validators and serializers are compiled at a route's first call, not at start-up
// (src/http/lazy-compile.ts): none is compiled by ready(), a call compiles its route's, and every
// schema of every route still compiles (compileAllSchemas), which start-up used to prove.
import t from '../helpers/tap.ts'
import { compileAllSchemas, compiledSchemas } from '../../src/app.ts'
import { startBroker } from '../helpers/broker.ts'

t.test('compiled at first use; every schema compiles', async (t) => {
  const { app } = await startBroker(t)
  await app.ready()
  t.equal(compiledSchemas(app), 0, 'ready() compiled no validator or serializer')

  const created = await app.inject({ method: 'PUT', url: '/v1/topics/lazy', payload: { partitions: 2 } })
  t.equal(created.statusCode, 201)
  t.equal(created.json().partitions, 2, 'the answer went through its serializer')
  const afterOne = compiledSchemas(app)
  t.ok(afterOne > 0, `a call compiled its route's schemas (${afterOne})`)

  // Validation works through the lazy validator, errors included.
  const bad = await app.inject({ method: 'PUT', url: '/v1/topics/lazy2', payload: { partitions: '4' } })
  t.equal(bad.statusCode, 400)
  t.match(bad.json(), { status: 400, detail: /partitions/ }, "the validator's errors reach the problem document")

  const total = compileAllSchemas(app)
  t.ok(total > 50, `every route's validators and serializers compiled (${total})`)
  t.equal(compiledSchemas(app), total, 'all compiled now')
  t.equal(compileAllSchemas(app), total, 'compiling again compiles nothing new')
  t.equal(compiledSchemas(app), total)
})

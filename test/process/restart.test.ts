import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import { databaseServerUrl, testDatabase } from '../helpers/db.ts'
import { spawnBroker, callBroker as call, type BrokerProcess } from '../helpers/process.ts'

async function readAll(base: string, topic: string, partitions: number) {
  const all: { partition: number; offset: number; value: string }[] = []
  for (let p = 0; p < partitions; p++) {
    for (let from = 0; ; ) {
      const page = await call(base, 'GET', `/v1/topics/${topic}/partitions/${p}/messages?fromOffset=${from}&limit=1000`)
      if (page.json.messages.length === 0) break
      all.push(...page.json.messages)
      from = page.json.nextOffset
    }
  }
  return all
}

interface Call {
  values: string[]
  outcome: 'ok' | 'failed'
  coords?: { partition: number; offset: number }[]
}

/** Producers that record every call as ok (with coordinates) or failed, until stopped. */
function produceLoad(base: string, topic: string, producers: number, maxCalls: number) {
  const calls: Call[] = []
  let stop = false
  const done = Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      for (let c = 0; c < maxCalls && !stop; c++) {
        const values = [0, 1, 2].map((i) => `p${p}-c${c}-m${i}`)
        const record: Call = { values, outcome: 'failed' }
        calls.push(record)
        try {
          const res = await call(base, 'POST', `/v1/topics/${topic}/messages`, { messages: values.map((value) => ({ value })) })
          if (res.status === 201) {
            record.outcome = 'ok'
            record.coords = res.json.results
          } else stop = true
        } catch {
          stop = true // the broker went away
        }
      }
    }),
  )
  return {
    calls,
    done,
    stop: () => {
      stop = true
    },
  }
}

/** Checks the log against what producers were told: every ok call stored where promised; none partly. */
function checkLog(t: Test, calls: Call[], stored: { partition: number; offset: number; value: string }[]) {
  const at = new Map(stored.map((m) => [`${m.partition}:${m.offset}`, m.value]))
  const present = new Set(stored.map((m) => m.value))
  let ok = 0
  for (const c of calls) {
    if (c.outcome === 'ok') {
      ok++
      c.coords!.forEach((co, i) => {
        if (at.get(`${co.partition}:${co.offset}`) !== c.values[i])
          t.fail(`acknowledged ${c.values[i]} missing at ${co.partition}:${co.offset}`)
      })
    } else {
      const n = c.values.filter((v) => present.has(v)).length
      if (n !== 0 && n !== c.values.length) t.fail(`call ${c.values[0]} was stored partly (${n} of ${c.values.length})`)
    }
  }
  t.equal(new Set(stored.map((m) => m.value)).size, stored.length, 'no message stored twice')
  return ok
}

function checkDense(t: Test, stored: { partition: number; offset: number }[], partitions: number) {
  for (let p = 0; p < partitions; p++) {
    const offsets = stored.filter((m) => m.partition === p).map((m) => m.offset)
    t.same(
      offsets,
      offsets.map((_, i) => i),
      `partition ${p} dense`,
    )
  }
}

/** The child's database: a fresh one on the server, else an embedded data directory. */
async function childDatabaseEnv(t: Test): Promise<Record<string, string>> {
  if (databaseServerUrl) return { DATABASE_URL: (await testDatabase(t)).url }
  const dataDir = await mkdtemp(join(tmpdir(), 'hookq-embedded-'))
  t.teardown(() => rm(dataDir, { recursive: true, force: true }))
  return { HOOKQ_DATA_DIR: dataDir }
}

t.test('SIGKILL mid-produce loses no acknowledged message (a server, or the embedded database)', async (t) => {
  const env = await childDatabaseEnv(t)
  let broker: BrokerProcess = await spawnBroker(env)
  t.teardown(() => {
    broker.child.kill('SIGKILL')
  })
  t.equal((await call(broker.url, 'PUT', '/v1/topics/crash', { partitions: 3 })).status, 201)

  const load = produceLoad(broker.url, 'crash', 16, 2000)
  // Let a good number of calls succeed, then kill without warning.
  const deadline = Date.now() + 20_000
  while (load.calls.filter((c) => c.outcome === 'ok').length < 300 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
  broker.child.kill('SIGKILL')
  t.equal(await broker.exited, 'SIGKILL')
  await load.done

  broker = await spawnBroker(env)
  const stored = await readAll(broker.url, 'crash', 3)
  const ok = checkLog(t, load.calls, stored)
  t.ok(ok >= 300, `${ok} acknowledged calls checked`)
  checkDense(t, stored, 3)
  // And the restarted broker keeps appending after the last offset.
  const more = await call(broker.url, 'POST', '/v1/topics/crash/messages', { messages: [{ value: 'after', partition: 0 }] })
  t.equal(more.json.results[0].offset, stored.filter((m) => m.partition === 0).length)
  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0)
})

t.test('SIGTERM finishes the calls in progress, exits 0, and the embedded database keeps them', async (t) => {
  const dataDir = await mkdtemp(join(tmpdir(), 'hookq-embedded-'))
  t.teardown(() => rm(dataDir, { recursive: true, force: true }))
  const env = { HOOKQ_DATA_DIR: dataDir } // always embedded: its close-and-reopen is what is tested
  let broker = await spawnBroker(env)
  t.teardown(() => {
    broker.child.kill('SIGKILL')
  })
  t.equal((await call(broker.url, 'PUT', '/v1/topics/graceful', { partitions: 2 })).status, 201)

  const load = produceLoad(broker.url, 'graceful', 8, 2000)
  while (load.calls.filter((c) => c.outcome === 'ok').length < 100) await new Promise((r) => setTimeout(r, 20))
  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0, 'exit code 0')
  await load.done
  t.match(broker.output(), /shutting down/)
  t.match(broker.output(), /embedded database: fsync=off/, 'the embedded mode says at start-up that it does not flush to disk')

  broker = await spawnBroker(env)
  const stored = await readAll(broker.url, 'graceful', 2)
  const ok = checkLog(t, load.calls, stored)
  t.ok(ok >= 100)
  checkDense(t, stored, 2)
  broker.child.kill('SIGTERM')
  t.equal(await broker.exited, 0)
})

/**
 * The key service's view of the stored keys, on a clock the test moves: a view older than the
 * bound (1.8 s, inside the contract's 2 s) is not trusted; a request that meets one reads the keys
 * itself before answering, and sees a deletion it had not heard of; when the keys cannot be read,
 * a stored key is 'stale' (the HTTP layer's 503), never let through. The view's age is on a
 * monotonic clock: the wall clock set back does not make an old view look young. A read whose rows
 * predate a key made or deleted on this process does not undo the change.
 */
import t from '../helpers/tap.ts'
import { KeyService, MAX_VIEW_AGE_MS } from '../../src/service/keys.ts'
import { openDatabase } from '../../src/store/db.ts'
import { testDatabase } from '../helpers/db.ts'
import { waitUntil } from '../helpers/wait.ts'

t.test('a stale view is read again before a key is trusted, and refused when it cannot be', async (t) => {
  const db = openDatabase((await testDatabase(t)).url, 2)
  t.teardown(() => db.close())
  // Both clocks move together here (no jump).
  let wallMs = Date.now()
  let monoMs = 1000
  const advance = (ms: number) => {
    wallMs += ms
    monoMs += ms
  }
  // A refresh interval far beyond the test: only lookups read the keys here.
  const keys = new KeyService(db, { now: () => wallMs, monotonicNow: () => monoMs, refreshMs: 3_600_000 })
  await keys.start()
  t.teardown(() => keys.stop())
  const { key, view } = await keys.create({ name: 'k', scopes: [{ action: 'produce' }] })
  t.match(keys.lookup(key), { id: view.id }, 'known at once on the process that made it')

  // Deleted behind this process's back (another process, or psql): its view does not know yet.
  await db.pool.query('DELETE FROM api_keys WHERE id = $1', [view.id])
  advance(MAX_VIEW_AGE_MS - 1)
  t.match(keys.lookup(key), { id: view.id }, 'a view younger than the bound is trusted')
  advance(2)
  t.equal(keys.lookup(key), 'stale', 'one older than the bound is not')
  t.equal(await keys.lookupFresh(key), undefined, 'a request reads the keys first, and the deleted key is unknown')

  // The keys cannot be read (the table is locked, as by a hung database): refused, not trusted.
  const other = await keys.create({ name: 'k2', scopes: [{ action: 'produce' }] })
  const locker = await db.pool.connect()
  await locker.query('BEGIN')
  await locker.query('LOCK TABLE api_key_version IN ACCESS EXCLUSIVE MODE')
  advance(MAX_VIEW_AGE_MS + 1)
  t.equal(await keys.lookupFresh(other.key), 'stale', 'no read: stale (503), not the old answer')
  await locker.query('ROLLBACK')
  locker.release()
})

t.test("the view's age does not follow the wall clock: set back, it does not make an old view trusted", async (t) => {
  const db = openDatabase((await testDatabase(t)).url, 2)
  t.teardown(() => db.close())
  let wallMs = Date.now()
  let monoMs = 1000
  const keys = new KeyService(db, { now: () => wallMs, monotonicNow: () => monoMs, refreshMs: 3_600_000 })
  await keys.start()
  t.teardown(() => keys.stop())
  const { key, view } = await keys.create({ name: 'k', scopes: [{ action: 'produce' }] })
  await db.pool.query('DELETE FROM api_keys WHERE id = $1', [view.id])

  // The view grows old while the wall clock is set back an hour (an NTP step, an operator).
  monoMs += MAX_VIEW_AGE_MS + 1
  wallMs += MAX_VIEW_AGE_MS + 1 - 3_600_000
  t.equal(keys.lookup(key), 'stale', 'an old view is not trusted, whatever the wall clock says')
  t.equal(await keys.lookupFresh(key), undefined, 'read again: the deleted key is unknown')

  // The wall clock set forward an hour: a fresh view stays trusted (no 503 for every stored key).
  const other = await keys.create({ name: 'k2', scopes: [{ action: 'produce' }] })
  wallMs += 3_600_000
  t.match(keys.lookup(other.key), { id: other.view.id }, 'a young view is trusted, whatever the wall clock says')
})

t.test('a read whose rows predate a key made or deleted here does not undo it', async (t) => {
  // As many connections as the database takes: the embedded one serves one socket at a time, and a
  // pool of 4 on it kept its idle first connection open while the create's or the delete's second
  // one waited to be admitted until the pool's 10 s connect timeout (every embedded run failed so).
  // The held read has handed its connection back by then, so one connection is enough here.
  const database = await testDatabase(t)
  const db = openDatabase(database.url, Math.min(database.maxConnections, 4))
  t.teardown(() => db.close())
  // The keys' list query answers as usual, but its rows are held until the test lets them go: a
  // read begun before a change here whose answer arrives after it (a slow database, a busy process).
  let hold: Promise<void> | undefined
  let held = 0
  let listed = 0
  const apiKey = new Proxy(db.prisma.apiKey, {
    get(target, prop, receiver) {
      if (prop !== 'findMany') return Reflect.get(target, prop, receiver)
      return async (...args: Parameters<typeof target.findMany>) => {
        listed++
        const rows = await target.findMany(...args)
        if (hold) {
          held++
          await hold
        }
        return rows
      }
    },
  })
  const prisma = new Proxy(db.prisma, {
    get: (target, prop, receiver) => (prop === 'apiKey' ? apiKey : Reflect.get(target, prop, receiver)),
  })
  const keys = new KeyService({ ...db, prisma }, { refreshMs: 3_600_000 })
  await keys.start()
  t.teardown(() => keys.stop())
  const old = await keys.create({ name: 'old', scopes: [{ action: 'produce' }] })

  let release!: () => void
  hold = new Promise((resolve) => {
    release = resolve
  })
  // The version moved (the key above), so this read lists the keys: its rows have `old`, not `made`.
  const reading = keys.refresh()
  await waitUntil(() => held === 1, 30_000, 'the read to list the keys')
  // A key made and one deleted while the read is held: both committed before its rows come back.
  const making = keys.create({ name: 'made', scopes: [{ action: 'produce' }] })
  const deleting = keys.delete(old.view.id)
  await waitUntil(
    async () => {
      const names = (await db.pool.query<{ name: string }>('SELECT name FROM api_keys ORDER BY name')).rows.map((r) => r.name)
      return names.length === 1 && names[0] === 'made'
    },
    30_000,
    'both changes committed',
  )
  hold = undefined
  release()
  await reading
  const made = await making
  await deleting
  t.match(keys.lookup(made.key), { id: made.view.id }, 'the key made during the read is known')
  t.equal(keys.lookup(old.key), undefined, 'the key deleted during the read is refused')
  // The next read lists the keys again, whatever the version says.
  await keys.refresh()
  t.equal(listed, 3, 'listed again after the changes')
  t.match(keys.lookup(made.key), { id: made.view.id })
  t.equal(keys.lookup(old.key), undefined)
})

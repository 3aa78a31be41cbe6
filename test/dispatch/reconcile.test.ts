/**
 * The dispatcher's reconciliation (every 5 s on every broker process) reads every group in a few
 * statements: its cost must not grow with groups that have nothing to do. And it still catches up
 * with what no notification told it: groups created, changed and deleted behind its back.
 */
import t from '../helpers/tap.ts'
import { AttemptLog } from '../../src/dispatch/attempt-log.ts'
import { Dispatcher } from '../../src/dispatch/dispatcher.ts'
import { createPushAgent } from '../../src/dispatch/pusher.ts'
import { GroupService } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { openDatabase } from '../../src/store/db.ts'
import { testDatabase } from '../helpers/db.ts'

t.test(
  'a reconciliation runs as many statements with 63 groups as with 3, and catches up with groups created and deleted behind its back',
  async (t) => {
    const database = await testDatabase(t)
    const db = openDatabase(database.url, database.maxConnections)
    t.teardown(() => db.close())
    const topics = new TopicService(db)
    const groups = new GroupService(db)
    const agent = createPushAgent()
    t.teardown(() => agent.destroy())
    // Every statement the dispatcher sends, Prisma's included (its adapter queries the same pool).
    let statements = 0
    const query = db.pool.query.bind(db.pool)
    db.pool.query = ((...args: Parameters<typeof query>) => {
      statements++
      return query(...args)
    }) as typeof db.pool.query
    const addGroups = async (from: number, to: number) => {
      for (let i = from; i < to; i++) {
        await topics.put(`t${i}`, 1)
        await groups.put(`g${i}`, { topic: `t${i}` })
        await groups.addConsumer(`g${i}`, { url: `https://example.com/hook/${i}` })
      }
    }
    await addGroups(0, 3)
    const attempts = new AttemptLog(db, { flushDelayMs: 1, holdMs: 1000, maxBuffered: 1000, onError: () => {} })
    const dispatcher = new Dispatcher({
      db,
      attempts,
      agent,
      loadGroup: (n) => groups.load(n),
      loadGroups: () => groups.loadAll(),
      ensureOffsets: async (row, topic) => {
        await groups.ensureOffsets(row, topic.id, topic.partitions)
      },
      disableConsumer: (id, reason) => groups.disableConsumer(id, reason),
      log: { warn: () => {}, error: () => {} },
    })
    t.teardown(async () => {
      await dispatcher.stop()
      await attempts.close()
    })
    await dispatcher.start()
    const reconcileStatements = async () => {
      const before = statements
      await dispatcher.reconcile()
      return statements - before
    }
    const few = await reconcileStatements()

    // Created, changed and deleted without telling the dispatcher (as another process would, its NOTIFY lost).
    await addGroups(3, 63)
    await reconcileStatements() // loads the 60 new groups (their offsets checked once)
    t.ok(dispatcher.hasGroup('g62'), 'a group created behind its back is loaded')
    const many = await reconcileStatements()
    t.equal(many, few, `statements of a reconciliation with 63 groups (${many}) as with 3 (${few})`)
    t.ok(few <= 5, `a handful of statements (${few})`)

    await groups.delete('g1')
    await dispatcher.reconcile()
    t.notOk(dispatcher.hasGroup('g1'), 'a group deleted behind its back is dropped')
    t.ok(dispatcher.hasGroup('g2'), 'the others stay')
  },
)

/**
 * The store's one shape (src/store/db.ts): every function takes the executor it runs on, so a
 * caller's transaction can hold several of them, and their writes commit or roll back together.
 * Raw SQL on a client of inTransaction, Prisma on the client of an interactive $transaction.
 */
import t from '../helpers/tap.ts'
import { GroupService } from '../../src/service/groups.ts'
import { TopicService } from '../../src/service/topics.ts'
import { inTransaction, openDatabase } from '../../src/store/db.ts'
import { findGroupByName, listConsumers, updateGroup } from '../../src/store/groups.ts'
import { claimPartition, ownerEpochs } from '../../src/store/membership.ts'
import { findTopicByName, setTopicRetention } from '../../src/store/topics.ts'
import { testDatabase } from '../helpers/db.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, database.maxConnections)
t.teardown(() => db.close())
const topics = new TopicService(db)
const groups = new GroupService(db)

await topics.put('tx', 1)
await groups.put('tx', { topic: 'tx' })
const topic = (await findTopicByName(db.prisma, 'tx'))!
const group = (await findGroupByName(db.prisma, 'tx'))!
await groups.ensureOffsets(group, topic.id, 1)
const key = { groupId: group.id, topicId: topic.id, partition: 0 }
const epoch = async () => (await ownerEpochs(db.pool, [key])).get(`${group.id}:0`)

t.test('raw SQL on a transaction client: seen inside, gone with the rollback, kept with the commit', async (t) => {
  const before = await epoch()
  await t.rejects(
    inTransaction(db, async (client) => {
      const claimed = await claimPartition(client, group.id, 0)
      t.equal(claimed, before! + 1, 'the claim runs in the transaction')
      t.equal((await ownerEpochs(client, [key])).get(`${group.id}:0`), claimed, 'and the transaction sees it')
      throw new Error('roll back')
    }),
    /roll back/,
  )
  t.equal(await epoch(), before, 'rolled back with it')
  const claimed = await inTransaction(db, (client) => claimPartition(client, group.id, 0))
  t.equal(await epoch(), claimed, 'committed with it')
})

t.test('Prisma on an interactive transaction client: two functions commit or roll back together', async (t) => {
  await t.rejects(
    db.prisma.$transaction(async (tx) => {
      await updateGroup(tx, group.id, { paused: true })
      await setTopicRetention(tx, topic.id, 1234)
      t.equal((await findGroupByName(tx, 'tx'))?.paused, true, 'the transaction sees its own change')
      throw new Error('roll back')
    }),
    /roll back/,
  )
  t.equal((await findGroupByName(db.prisma, 'tx'))?.paused, false, 'the group change rolled back')
  t.not((await findTopicByName(db.prisma, 'tx'))?.retentionMs, 1234, 'and the topic change with it')
  await db.prisma.$transaction(async (tx) => {
    await updateGroup(tx, group.id, { paused: true })
    await setTopicRetention(tx, topic.id, 1234)
  })
  t.equal((await findGroupByName(db.prisma, 'tx'))?.paused, true)
  t.equal((await findTopicByName(db.prisma, 'tx'))?.retentionMs, 1234)
  t.same(await listConsumers(db.prisma, group.id), [], 'and the plain client works as before')
})

/**
 * src/store/messages.ts appendRows against a real PostgreSQL: the statement hands out one range of
 * offsets per partition and returns only its first offset; appendRows numbers the entries from it
 * in input order. Here each reported offset is checked against the row the statement stored.
 */
import t from '../helpers/tap.ts'
import { openDatabase } from '../../src/store/db.ts'
import { appendRows, readMessages } from '../../src/store/messages.ts'
import { findTopicByName } from '../../src/store/topics.ts'
import { TopicService } from '../../src/service/topics.ts'
import { testDatabase } from '../helpers/db.ts'
import { appendEntry } from '../helpers/messages.ts'

const database = await testDatabase(t)
const db = openDatabase(database.url, database.maxConnections)
t.teardown(() => db.close())
const topics = new TopicService(db)

const entry = appendEntry

t.test('offsets reported in input order match the rows stored, across partitions and topics', async (t) => {
  await topics.put('append-a', 3)
  await topics.put('append-b', 2)
  const a = (await findTopicByName(db.prisma, 'append-a'))!.id
  const b = (await findTopicByName(db.prisma, 'append-b'))!.id
  // A first append so the ranges below do not start at 0.
  await appendRows(db.pool, [entry(a, 1, 'a1-first'), entry(b, 0, 'b0-first')])
  // Partitions interleaved, two topics, and a partition that does not exist (no row for it).
  const entries = [
    entry(a, 2, 'a2-0'),
    entry(b, 1, 'b1-0'),
    entry(a, 1, 'a1-0'),
    entry(a, 2, 'a2-1'),
    entry(b, 0, 'b0-0'),
    entry(a, 7, 'nowhere'),
    entry(a, 1, 'a1-1'),
    entry(a, 2, 'a2-2'),
  ]
  const rows = await appendRows(db.pool, entries)
  t.same(
    rows.map((r) => [r.ord, r.partition, r.offset]),
    [
      [1, 2, 0],
      [2, 1, 0],
      [3, 1, 1],
      [4, 2, 1],
      [5, 0, 1],
      [7, 1, 2],
      [8, 2, 2],
    ],
    'each partition numbered from its first offset, in input order; the missing partition left out',
  )
  t.equal(new Set(rows.map((r) => r.at_ms)).size, 1, 'one produce time for the statement')
  for (const r of rows) {
    const e = entries[r.ord - 1]!
    const [stored] = await readMessages(db.pool, e.topicId, r.partition, r.offset, 1)
    t.equal(stored?.value, e.value, `${JSON.parse(e.value)} is stored at ${r.partition}/${r.offset}`)
    t.equal(stored?.timestamp.getTime(), r.at_ms, 'at the produce time reported')
  }
})

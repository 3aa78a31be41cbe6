/** readAllLags: the lag of every group partition in one statement, whatever the number of groups. */
import t from '../helpers/tap.ts'
import { openDatabase, type Queryable } from '../../src/store/db.ts'
import { readAllLags } from '../../src/store/groups.ts'
import { testDatabase } from '../helpers/db.ts'

t.test('one statement answers the lag of 300 groups on 3 topics, and leaves out groups with no topic or offsets', async (t) => {
  const database = await testDatabase(t)
  const db = openDatabase(database.url, database.maxConnections)
  t.teardown(() => db.close())
  // Rows written directly: what is read is the store's, not how the service makes it.
  await db.pool.query(`
    INSERT INTO topics (name, partitions, retention_ms) SELECT 't' || i, 2, 86400000 FROM generate_series(0, 2) i;
    INSERT INTO topic_partitions (topic_id, partition, next_offset)
      SELECT id, p, 100 * p + 10 FROM topics, generate_series(0, 1) p;
    INSERT INTO consumer_groups (name, topic) SELECT 'g' || lpad(i::text, 3, '0'), 't' || (i % 3) FROM generate_series(0, 299) i;
    INSERT INTO group_offsets (group_id, topic_id, partition, committed_offset)
      SELECT g.id, t.id, p, p * 100 + (substr(g.name, 2)::int % 7) FROM consumer_groups g JOIN topics t ON t.name = g.topic, generate_series(0, 1) p;
    -- A group whose topic is gone, and one whose offsets are not written yet: neither has a lag to show.
    INSERT INTO consumer_groups (name, topic) VALUES ('orphan', 'no-such-topic'), ('new', 't0');
    -- A committed offset past the end (a topic recreated under the group) shows 0, never a negative lag.
    UPDATE group_offsets SET committed_offset = 500 WHERE group_id = (SELECT id FROM consumer_groups WHERE name = 'g000') AND partition = 0;
  `)
  let statements = 0
  const counting: Queryable = {
    query: (...args: Parameters<Queryable['query']>) => {
      statements++
      return (db.pool as Queryable).query(...args)
    },
  }
  const lags = await readAllLags(counting)
  t.equal(statements, 1, 'one statement for all groups')
  t.equal(lags.length, 600, 'two partitions of each of the 300 groups')
  t.notOk(
    lags.some((l) => l.group === 'orphan' || l.group === 'new'),
    'no row for a group without topic or offsets',
  )
  const g = (name: string, partition: number) => lags.find((l) => l.group === name && l.partition === partition)
  t.match(g('g008', 0), { lag: 10 - 1, partition: 0 }, 'end offset minus committed offset')
  t.match(g('g008', 1), { lag: 110 - 101 })
  t.equal(g('g000', 0)?.lag, 0, 'never below 0')
  t.equal(typeof g('g008', 0)?.groupId, 'number')
})

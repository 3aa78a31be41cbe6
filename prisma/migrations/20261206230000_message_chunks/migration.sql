-- messages partitioned in two levels, so that retention drops whole chunks of one topic's messages
-- instead of deleting rows: no dead rows, no vacuum, however high the produce rate (issue 34).
--
--   messages                     PARTITION BY LIST (topic_id)
--     messages_legacy            the table as it was, for the topics that existed (and ids with rows)
--     messages_t<id>             one per topic created since, PARTITION BY RANGE (produced_at)
--       messages_t<id>_<from>_<to>   a chunk: the topic's messages of a span of time
--       messages_t<id>_default       the topic's rows no chunk covers (filed into chunks made for them)
--     messages_default           rows of a topic that has no tree yet (filed when it is made)
--
-- Why two levels and not one range on (topic_id, produced_at): a read names its topic, and LIST
-- pruning on topic_id leaves out every other topic's tree and the top default, so a read plans,
-- opens and locks one topic's chunks only; and making or dropping a chunk locks that topic's tree,
-- never the whole table (src/store/message-chunks.ts, docs/performance.md "Messages in chunks").
--
-- No row is copied and no tree is made here: the table becomes messages_legacy, attached as the
-- LIST partition of every topic id it may hold (the topics, and ids of deleted topics that left
-- rows). ATTACH scans it once to check that (no rewrite, no second copy on disk); a migration that
-- copied it held ACCESS EXCLUSIVE for a full copy, and one that made every topic's tree here took
-- 28 locks a topic in one transaction (out of lock table at ~720 topics). Those topics keep their
-- rows and go on being produced into messages_legacy, and the sweep deletes their rows past the
-- retention row by row, as before (src/store/message-chunks.ts, maintainLegacy); topics created
-- from now on get a tree of chunks, made by the broker one topic per transaction.
--
-- The parent of a database that had messages has no primary key: one on it must hold every level's
-- partition key (produced_at), which messages_legacy's (topic_id, partition, "offset") does not, and
-- attaching would build that index over the whole table (a new database's parent has it). Each tree has the key (topic_id, partition, "offset", produced_at),
-- messages_legacy keeps its own; an offset is unique because produce hands it out under its
-- partition row's lock. The (topic_id, produced_at) index is messages_legacy's, attached as it is.
ALTER TABLE "messages" RENAME TO "messages_legacy";
ALTER TABLE "messages_legacy" RENAME CONSTRAINT "messages_pkey" TO "messages_legacy_pkey";
ALTER INDEX "messages_topic_id_produced_at_idx" RENAME TO "messages_legacy_topic_id_produced_at_idx";

CREATE TABLE "messages" (
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    "key" TEXT,
    "value" TEXT NOT NULL,
    "headers" TEXT NOT NULL DEFAULT '{}',
    "produced_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "available_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "trace_id" UUID,
    "traceparent" TEXT,
    "tracestate" TEXT
) PARTITION BY LIST ("topic_id");

CREATE INDEX "messages_topic_id_produced_at_idx" ON "messages"("topic_id", "produced_at");

DO $$
DECLARE
  ids text;
BEGIN
  -- The distinct topic ids of the rows by a walk of the primary key (one probe per topic, not a
  -- scan), and every topic's.
  WITH RECURSIVE walk(id) AS (
    SELECT min("topic_id") FROM "messages_legacy"
    UNION ALL
    SELECT (SELECT min("topic_id") FROM "messages_legacy" WHERE "topic_id" > walk.id) FROM walk WHERE walk.id IS NOT NULL
  )
  SELECT string_agg(id::text, ', ' ORDER BY id) INTO ids
  FROM (SELECT id FROM walk WHERE id IS NOT NULL UNION SELECT "id" FROM "topics") all_ids;
  IF ids IS NULL THEN
    -- No topic and no row (a new database): nothing to keep, and the key Prisma's schema names
    -- can be had on the empty parent.
    EXECUTE 'DROP TABLE messages_legacy';
    EXECUTE 'ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (topic_id, partition, "offset", produced_at)';
  ELSE
    EXECUTE format('ALTER TABLE "messages" ATTACH PARTITION "messages_legacy" FOR VALUES IN (%s)', ids);
  END IF;
END
$$;

-- After messages_legacy: attaching it then needs no scan of a default.
CREATE TABLE "messages_default" PARTITION OF "messages" DEFAULT;

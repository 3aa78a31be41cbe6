-- messages partitioned in two levels, so that retention drops whole chunks of one topic's messages
-- instead of deleting rows: no dead rows, no vacuum, however high the produce rate (issue 34).
--
--   messages                     PARTITION BY RANGE (topic_id)
--     messages_legacy            the table as it was: ids FROM (MINVALUE) TO (the first id no topic had)
--     messages_t<id>             one per topic created since, ids FROM (id) TO (id + 1),
--                                  PARTITION BY RANGE (produced_at)
--       messages_t<id>_<from>_<to>   a chunk: the topic's messages of a span of time
--       messages_t<id>_default       the topic's rows no chunk covers (filed into chunks made for them)
--     messages_default           rows of a topic that has no tree yet (filed when it is made)
--
-- Why two levels and not one range on (topic_id, produced_at): a read names its topic, and
-- pruning on topic_id leaves out every other topic's tree and the top default, so a read plans,
-- opens and locks one topic's chunks only; and making or dropping a chunk locks that topic's tree,
-- never the whole table (src/store/message-chunks.ts, docs/performance.md "Messages in chunks").
--
-- No row is copied and no tree is made here: the table becomes messages_legacy, attached as the
-- range of every topic id below a bound above the topics' ids, the ids its rows have (deleted
-- topics' too) and the topics' id sequence, which is moved up to it if it is below: every topic
-- from now on has an id at or above it, and a topic is a legacy one iff its id is below it (read
-- back from the catalog, src/store/message-chunks.ts legacyBound). Not a LIST of the ids: a
-- partition bound is stored in pg_class, which has no TOAST, and a list of more than some
-- 600-1,000 ids made the row too big (ERROR: row is too big), the upgrade failing for good. ATTACH scans it once to check that (no rewrite, no second copy on disk); a migration that
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
) PARTITION BY RANGE ("topic_id");

CREATE INDEX "messages_topic_id_produced_at_idx" ON "messages"("topic_id", "produced_at");

DO $$
DECLARE
  seq text := pg_get_serial_sequence('topics', 'id');
  next_id bigint;
  upper bigint;
BEGIN
  -- The sequence's next value (last_value itself when it was never called).
  EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s', seq) INTO next_id;
  -- The greatest topic id of the rows is one probe of the primary key (topic_id leads it).
  SELECT greatest((SELECT max("topic_id") FROM "messages_legacy") + 1, (SELECT max("id") FROM "topics") + 1) INTO upper;
  IF upper IS NULL THEN
    -- No topic and no row (a new database): nothing to keep, and the key Prisma's schema names
    -- can be had on the empty parent.
    EXECUTE 'DROP TABLE messages_legacy';
    EXECUTE 'ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (topic_id, partition, "offset", produced_at)';
  ELSE
    upper := greatest(upper, next_id);
    -- Ids handed out from now on start at the bound (setval is not undone by a rollback: harmless,
    -- ids are only ever skipped).
    IF next_id < upper THEN
      PERFORM setval(seq, upper, false);
    END IF;
    EXECUTE format('ALTER TABLE "messages" ATTACH PARTITION "messages_legacy" FOR VALUES FROM (MINVALUE) TO (%s)', upper);
  END IF;
END
$$;

-- After messages_legacy: attaching it then needs no scan of a default.
CREATE TABLE "messages_default" PARTITION OF "messages" DEFAULT;

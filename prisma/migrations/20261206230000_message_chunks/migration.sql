-- messages partitioned in two levels, so that retention drops whole chunks of one topic's messages
-- instead of deleting rows: no dead rows, no vacuum, however high the produce rate (issue 34).
--
--   messages                     PARTITION BY LIST (topic_id)
--     messages_t<id>             one per topic, PARTITION BY RANGE (produced_at)
--       messages_t<id>_<from>_<to>   a chunk: the topic's messages of a span of time
--       messages_t<id>_default       the topic's rows no chunk covers (filed into chunks made for them)
--     messages_default           rows of a topic that has no tree yet (filed when it is made)
--
-- Why two levels and not one range on (topic_id, produced_at): a read names its topic, and LIST
-- pruning on topic_id leaves out every other topic's tree and the top default, so a read plans,
-- opens and locks one topic's chunks only; and making or dropping a chunk locks that topic's tree,
-- never the whole table (src/store/message-chunks.ts, docs/performance.md "Messages in chunks").
--
-- A partitioned table's primary key must hold every level's partition key, so produced_at ends it:
-- an offset stays unique because produce hands it out under its partition row's lock.
--
-- Every message is kept: one table holds every topic, so it cannot become a chunk as it is; per
-- topic a tree with a first chunk covering everything produced up to now is made, and the rows are
-- copied in. The chunks after it are made by the broker at start-up (before it serves), and by
-- every sweep.
ALTER TABLE "messages" RENAME TO "messages_old";
ALTER TABLE "messages_old" RENAME CONSTRAINT "messages_pkey" TO "messages_old_pkey";
ALTER INDEX "messages_topic_id_produced_at_idx" RENAME TO "messages_old_topic_id_produced_at_idx";

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
    "tracestate" TEXT,

    CONSTRAINT "messages_pkey" PRIMARY KEY ("topic_id", "partition", "offset", "produced_at")
) PARTITION BY LIST ("topic_id");

CREATE INDEX "messages_topic_id_produced_at_idx" ON "messages"("topic_id", "produced_at");

CREATE TABLE "messages_default" PARTITION OF "messages" DEFAULT;

-- Chunks are named messages_t<topic>_<from>_<to>, the bounds in ms since the epoch (0: from the start).
DO $$
DECLARE
  upto bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1;
  tid int;
BEGIN
  FOR tid IN SELECT id FROM "topics" UNION SELECT DISTINCT "topic_id" FROM "messages_old" LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF "messages" FOR VALUES IN (%s) PARTITION BY RANGE ("produced_at")',
                   'messages_t' || tid, tid);
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (MINVALUE) TO (%L)',
                   'messages_t' || tid || '_0_' || upto, 'messages_t' || tid, to_timestamp(upto / 1000.0));
    EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', 'messages_t' || tid || '_default', 'messages_t' || tid);
  END LOOP;
END
$$;

INSERT INTO "messages" ("topic_id", "partition", "offset", "key", "value", "headers", "produced_at", "available_at",
                        "trace_id", "traceparent", "tracestate")
SELECT "topic_id", "partition", "offset", "key", "value", "headers", "produced_at", "available_at",
       "trace_id", "traceparent", "tracestate"
FROM "messages_old";

DROP TABLE "messages_old";

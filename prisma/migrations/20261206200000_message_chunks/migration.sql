-- messages partitioned by range of (topic_id, produced_at), so that retention drops whole chunks
-- of one topic's messages instead of deleting rows: no dead rows, no vacuum, however high the
-- produce rate (issue 34; src/store/message-chunks.ts makes the chunks ahead and drops the expired
-- ones; docs/performance.md, "Messages in chunks", says why this key and not another).
--
-- A partitioned table's primary key must hold the partition key, so produced_at ends it: an offset
-- stays unique because produce hands it out under its partition row's lock (topic_partitions).
--
-- Every message is kept: one table holds every topic, so it cannot become a chunk as it is; per
-- topic a first chunk covers everything produced before now, and the rows are copied into them.
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
) PARTITION BY RANGE ("topic_id", "produced_at");

CREATE INDEX "messages_topic_id_produced_at_idx" ON "messages"("topic_id", "produced_at");

-- Chunks are named messages_<topic>_<from>_<to>, the bounds in ms since the epoch (0: from the start).
DO $$
DECLARE
  upto bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1;
  tid int;
BEGIN
  FOR tid IN SELECT id FROM "topics" UNION SELECT DISTINCT "topic_id" FROM "messages_old" LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF "messages" FOR VALUES FROM (%s, MINVALUE) TO (%s, %L)',
                   'messages_' || tid || '_0_' || upto, tid, tid, to_timestamp(upto / 1000.0));
  END LOOP;
END
$$;

-- Where a row goes when no chunk covers it (a topic made since the last sweep): each sweep files
-- its rows into the chunks made for them, or deletes them once past their retention.
CREATE TABLE "messages_default" PARTITION OF "messages" DEFAULT;

INSERT INTO "messages" ("topic_id", "partition", "offset", "key", "value", "headers", "produced_at", "available_at",
                        "trace_id", "traceparent", "tracestate")
SELECT "topic_id", "partition", "offset", "key", "value", "headers", "produced_at", "available_at",
       "trace_id", "traceparent", "tracestate"
FROM "messages_old";

DROP TABLE "messages_old";

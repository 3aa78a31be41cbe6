-- Idempotency keys in a table of their own (issue 34). The unique index on messages
-- (topic_id, idempotency_key) kept messages from being partitioned: a unique index on a partitioned
-- table must hold the partition key, and the key's uniqueness spans every chunk of time. Only keyed
-- messages have a row here; the retention sweep deletes those past their topic's retention.
CREATE TABLE "idempotency_keys" (
    "topic_id" INTEGER NOT NULL,
    "key" TEXT NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    "produced_at" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "idempotency_keys_pkey" PRIMARY KEY ("topic_id","key")
);

CREATE INDEX "idempotency_keys_topic_id_produced_at_idx" ON "idempotency_keys"("topic_id", "produced_at");

-- Every key stored today moves over with its message's coordinates (the unique index held at most
-- one message per key).
INSERT INTO "idempotency_keys" ("topic_id", "key", "partition", "offset", "produced_at")
SELECT "topic_id", "idempotency_key", "partition", "offset", "produced_at" FROM "messages" WHERE "idempotency_key" IS NOT NULL;

DROP INDEX "messages_topic_id_idempotency_key_key";

-- Dropping a column rewrites nothing (its space is reused as rows are written).
ALTER TABLE "messages" DROP COLUMN "idempotency_key";

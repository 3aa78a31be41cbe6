-- The attempt log (deliveries) partitioned by time, so that its retention drops whole partitions
-- instead of deleting rows: no dead rows, no vacuum, however high the push rate (issue 34; see
-- src/store/attempt-partitions.ts, which creates the partitions ahead and drops the expired ones).
--
-- The partition key is filed_at: the start of the attempt (started_at) when it is written; a row
-- the retention must keep (the newest attempt of a message still in progress, which its attempt
-- count is read from) is copied forward into the current partition with a new filed_at before its
-- partition is dropped. A partitioned table's primary key must hold the partition key, so filed_at
-- ends it: the delivery id still names one attempt (it carries 128 random bits).
--
-- The existing table becomes the first partition, unchanged but for the new column (a constant
-- default: no rewrite), covering everything filed before now; the retention drops it once now is
-- past the retention, keeping what must be kept, as it does every partition.
ALTER TABLE "deliveries" RENAME TO "deliveries_old";
ALTER TABLE "deliveries_old" RENAME CONSTRAINT "deliveries_pkey" TO "deliveries_old_pkey";
ALTER INDEX "deliveries_group_id_started_at_idx" RENAME TO "deliveries_old_group_id_started_at_idx";
ALTER TABLE "deliveries_old" ADD COLUMN "filed_at" TIMESTAMPTZ(3) NOT NULL DEFAULT '-infinity';
ALTER TABLE "deliveries_old" ALTER COLUMN "filed_at" DROP DEFAULT;
ALTER TABLE "deliveries_old" DROP CONSTRAINT "deliveries_old_pkey";

CREATE TABLE "deliveries" (
    "id" TEXT NOT NULL,
    "group_id" INTEGER NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    "attempt" INTEGER NOT NULL,
    "consumer_id" TEXT,
    "started_at" TIMESTAMPTZ(3) NOT NULL,
    "finished_at" TIMESTAMPTZ(3),
    "ack_deadline" TIMESTAMPTZ(3),
    "status_code" INTEGER,
    "duration_ms" INTEGER,
    "error" TEXT,
    "outcome" "delivery_outcome" NOT NULL,
    "filed_at" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "deliveries_pkey" PRIMARY KEY ("group_id", "partition", "offset", "attempt", "id", "filed_at")
) PARTITION BY RANGE ("filed_at");

CREATE INDEX "deliveries_group_id_started_at_idx" ON "deliveries"("group_id", "started_at" DESC);

-- Partitions are named deliveries_<from>_<to>, the bounds in ms since the epoch (0: from the start).
DO $$
DECLARE
  upto bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
  EXECUTE format('ALTER TABLE "deliveries_old" RENAME TO %I', 'deliveries_0_' || upto);
  EXECUTE format('ALTER TABLE "deliveries" ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                 'deliveries_0_' || upto, to_timestamp(upto / 1000.0));
END
$$;

-- Where a row goes when no partition covers its filed_at (maintenance stopped for longer than it
-- makes partitions ahead; a process that never maintains, as in tests): maintenance empties it into
-- the partitions at its next run, so it stays empty and costs every statement nothing.
CREATE TABLE "deliveries_default" PARTITION OF "deliveries" DEFAULT WITH (fillfactor = 70);

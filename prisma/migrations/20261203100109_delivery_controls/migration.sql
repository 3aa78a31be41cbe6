-- CreateEnum
CREATE TYPE "ordering" AS ENUM ('none', 'partition', 'key');

-- v1.1 delivery controls: ordering keys, filters, batch push, consumer limits and health.

-- AlterTable
ALTER TABLE "consumer_groups" ADD COLUMN     "batch_max_bytes" INTEGER,
ADD COLUMN     "batch_max_messages" INTEGER,
ADD COLUMN     "batch_max_wait_ms" INTEGER NOT NULL DEFAULT 0,
ADD COLUMN     "filter" TEXT,
ADD COLUMN     "ordering" "ordering" NOT NULL DEFAULT 'none';

-- A group's ordering becomes one of three: `ordered` (a boolean) said none or partition, and is
-- carried over before it goes.
UPDATE "consumer_groups" SET "ordering" = 'partition' WHERE "ordered";
ALTER TABLE "consumer_groups" DROP COLUMN "ordered";

-- AlterTable
ALTER TABLE "consumers" ADD COLUMN     "last_error" TEXT,
ADD COLUMN     "last_failure_at" TIMESTAMPTZ(3),
ADD COLUMN     "last_success_at" TIMESTAMPTZ(3),
ADD COLUMN     "max_concurrency" INTEGER,
ADD COLUMN     "rate_limit_per_second" DOUBLE PRECISION;

-- AlterTable
ALTER TABLE "group_offsets" ADD COLUMN     "filtered" BIGINT NOT NULL DEFAULT 0;

-- CreateTable
CREATE TABLE "consumer_health" (
    "consumer_id" TEXT NOT NULL,
    "bucket" TIMESTAMPTZ(3) NOT NULL,
    "successes" INTEGER NOT NULL DEFAULT 0,
    "failures" INTEGER NOT NULL DEFAULT 0,

    CONSTRAINT "consumer_health_pkey" PRIMARY KEY ("consumer_id","bucket")
);

-- AddForeignKey
ALTER TABLE "consumer_health" ADD CONSTRAINT "consumer_health_consumer_id_fkey" FOREIGN KEY ("consumer_id") REFERENCES "consumers"("id") ON DELETE CASCADE ON UPDATE CASCADE;

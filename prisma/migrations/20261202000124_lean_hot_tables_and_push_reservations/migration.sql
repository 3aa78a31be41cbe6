-- DropForeignKey
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_group_id_fkey";

-- DropForeignKey
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_topic_id_fkey";

-- DropForeignKey
ALTER TABLE "group_completions" DROP CONSTRAINT "group_completions_group_id_fkey";

-- DropForeignKey
ALTER TABLE "group_completions" DROP CONSTRAINT "group_completions_topic_id_fkey";

-- DropForeignKey
ALTER TABLE "group_offsets" DROP CONSTRAINT "group_offsets_group_id_fkey";

-- DropForeignKey
ALTER TABLE "group_offsets" DROP CONSTRAINT "group_offsets_topic_id_fkey";

-- DropForeignKey
ALTER TABLE "messages" DROP CONSTRAINT "messages_topic_id_fkey";

-- DropIndex
DROP INDEX "deliveries_group_id_topic_id_partition_offset_idx";

-- AlterTable
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_pkey",
ADD CONSTRAINT "deliveries_pkey" PRIMARY KEY ("group_id", "partition", "offset", "attempt", "id");

-- AlterTable
ALTER TABLE "group_offsets" ADD COLUMN     "pushed_offset" BIGINT NOT NULL DEFAULT 0,
ADD COLUMN     "seeked_at" TIMESTAMPTZ(3);

-- Room on each page for the outcome update of its rows, so it stays a HOT update (no new index
-- entries): none of the columns an outcome sets is indexed.
ALTER TABLE "deliveries" SET (fillfactor = 70);

-- AlterTable
ALTER TABLE "consumer_groups" ADD COLUMN     "filter" TEXT;

-- AlterTable
ALTER TABLE "group_offsets" ADD COLUMN     "filtered" BIGINT NOT NULL DEFAULT 0;

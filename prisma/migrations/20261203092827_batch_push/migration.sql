-- AlterTable
ALTER TABLE "consumer_groups" ADD COLUMN     "batch_max_bytes" INTEGER,
ADD COLUMN     "batch_max_messages" INTEGER,
ADD COLUMN     "batch_max_wait_ms" INTEGER NOT NULL DEFAULT 0;

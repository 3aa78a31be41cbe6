-- CreateEnum
CREATE TYPE "ack_mode" AS ENUM ('explicit', 'auto');

-- CreateEnum
CREATE TYPE "push_format" AS ENUM ('envelope', 'raw');

-- CreateEnum
CREATE TYPE "delivery_outcome" AS ENUM ('in_flight', 'acked', 'failed', 'timed_out', 'nacked', 'dead');

-- CreateTable
CREATE TABLE "consumer_groups" (
    "id" SERIAL NOT NULL,
    "name" TEXT NOT NULL,
    "topic" TEXT NOT NULL,
    "ack_mode" "ack_mode" NOT NULL DEFAULT 'explicit',
    "ack_timeout_ms" INTEGER NOT NULL DEFAULT 30000,
    "max_deliveries" INTEGER NOT NULL DEFAULT 5,
    "retry_initial_delay_ms" INTEGER NOT NULL DEFAULT 1000,
    "retry_multiplier" DOUBLE PRECISION NOT NULL DEFAULT 2,
    "retry_max_delay_ms" INTEGER NOT NULL DEFAULT 60000,
    "retry_jitter" DOUBLE PRECISION NOT NULL DEFAULT 0.1,
    "dead_letter_topic" TEXT,
    "start_at" TEXT NOT NULL DEFAULT 'earliest',
    "max_in_flight" INTEGER NOT NULL DEFAULT 100,
    "ordered" BOOLEAN NOT NULL DEFAULT false,
    "push_timeout_ms" INTEGER NOT NULL DEFAULT 10000,
    "push_format" "push_format" NOT NULL DEFAULT 'envelope',
    "paused" BOOLEAN NOT NULL DEFAULT false,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updated_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "consumer_groups_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "consumers" (
    "id" TEXT NOT NULL,
    "group_id" INTEGER NOT NULL,
    "url" TEXT NOT NULL,
    "secret" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "disabled_at" TIMESTAMPTZ(3),
    "disabled_reason" TEXT,

    CONSTRAINT "consumers_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "group_offsets" (
    "group_id" INTEGER NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "committed_offset" BIGINT NOT NULL,

    CONSTRAINT "group_offsets_pkey" PRIMARY KEY ("group_id","topic_id","partition")
);

-- CreateTable
CREATE TABLE "group_completions" (
    "group_id" INTEGER NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,

    CONSTRAINT "group_completions_pkey" PRIMARY KEY ("group_id","topic_id","partition","offset")
);

-- CreateTable
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

    CONSTRAINT "deliveries_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "consumer_groups_name_key" ON "consumer_groups"("name");

-- CreateIndex
CREATE INDEX "consumer_groups_topic_idx" ON "consumer_groups"("topic");

-- CreateIndex
CREATE INDEX "consumers_group_id_idx" ON "consumers"("group_id");

-- CreateIndex
CREATE INDEX "deliveries_group_id_started_at_idx" ON "deliveries"("group_id", "started_at" DESC);

-- CreateIndex
CREATE INDEX "deliveries_group_id_topic_id_partition_offset_idx" ON "deliveries"("group_id", "topic_id", "partition", "offset");

-- AddForeignKey
ALTER TABLE "consumers" ADD CONSTRAINT "consumers_group_id_fkey" FOREIGN KEY ("group_id") REFERENCES "consumer_groups"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "group_offsets" ADD CONSTRAINT "group_offsets_group_id_fkey" FOREIGN KEY ("group_id") REFERENCES "consumer_groups"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "group_offsets" ADD CONSTRAINT "group_offsets_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "group_completions" ADD CONSTRAINT "group_completions_group_id_fkey" FOREIGN KEY ("group_id") REFERENCES "consumer_groups"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "group_completions" ADD CONSTRAINT "group_completions_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "deliveries" ADD CONSTRAINT "deliveries_group_id_fkey" FOREIGN KEY ("group_id") REFERENCES "consumer_groups"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "deliveries" ADD CONSTRAINT "deliveries_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

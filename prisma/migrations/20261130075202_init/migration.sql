-- CreateTable
CREATE TABLE "topics" (
    "id" SERIAL NOT NULL,
    "name" TEXT NOT NULL,
    "partitions" INTEGER NOT NULL,
    "retention_ms" BIGINT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "topics_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "topic_partitions" (
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "next_offset" BIGINT NOT NULL DEFAULT 0,

    CONSTRAINT "topic_partitions_pkey" PRIMARY KEY ("topic_id","partition")
);

-- CreateTable
CREATE TABLE "messages" (
    "topic_id" INTEGER NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    "key" TEXT,
    "value" TEXT NOT NULL,
    "headers" TEXT NOT NULL DEFAULT '{}',
    "produced_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "available_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "idempotency_key" TEXT,

    CONSTRAINT "messages_pkey" PRIMARY KEY ("topic_id","partition","offset")
);

-- CreateIndex
CREATE UNIQUE INDEX "topics_name_key" ON "topics"("name");

-- CreateIndex
CREATE INDEX "messages_topic_id_produced_at_idx" ON "messages"("topic_id", "produced_at");

-- CreateIndex
CREATE UNIQUE INDEX "messages_topic_id_idempotency_key_key" ON "messages"("topic_id", "idempotency_key");

-- AddForeignKey
ALTER TABLE "topic_partitions" ADD CONSTRAINT "topic_partitions_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "messages" ADD CONSTRAINT "messages_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

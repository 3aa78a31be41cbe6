-- CreateTable
CREATE TABLE "produce_outbox_set_aside" (
    "id" BIGINT NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "key" TEXT,
    "value" TEXT NOT NULL,
    "headers" TEXT NOT NULL,
    "delay_ms" INTEGER NOT NULL,
    "idempotency_key" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL,
    "set_aside_at" TIMESTAMPTZ(3) NOT NULL DEFAULT clock_timestamp(),
    "reason" TEXT NOT NULL,

    CONSTRAINT "produce_outbox_set_aside_pkey" PRIMARY KEY ("id")
);

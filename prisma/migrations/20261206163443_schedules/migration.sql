-- CreateTable
CREATE TABLE "schedules" (
    "id" SERIAL NOT NULL,
    "name" TEXT NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "cron" TEXT,
    "every_ms" BIGINT,
    "time_zone" TEXT NOT NULL DEFAULT 'UTC',
    "value" TEXT NOT NULL,
    "key" TEXT,
    "headers" TEXT NOT NULL DEFAULT '{}',
    "paused" BOOLEAN NOT NULL DEFAULT false,
    "missed" TEXT NOT NULL DEFAULT 'skip',
    "next_tick_at" TIMESTAMPTZ(3),
    "last_tick_at" TIMESTAMPTZ(3),
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updated_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "schedules_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "schedule_runners" (
    "id" TEXT NOT NULL,
    "started_at" TIMESTAMPTZ(3) NOT NULL,
    "alive_at" TIMESTAMPTZ(3) NOT NULL,
    "stopped_at" TIMESTAMPTZ(3),

    CONSTRAINT "schedule_runners_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "schedules_name_key" ON "schedules"("name");

-- CreateIndex
CREATE INDEX "schedules_next_tick_at_idx" ON "schedules"("next_tick_at");

-- CreateIndex
CREATE INDEX "schedules_topic_id_idx" ON "schedules"("topic_id");

-- CreateIndex
CREATE INDEX "schedule_runners_alive_at_idx" ON "schedule_runners"("alive_at");

-- AddForeignKey
ALTER TABLE "schedules" ADD CONSTRAINT "schedules_topic_id_fkey" FOREIGN KEY ("topic_id") REFERENCES "topics"("id") ON DELETE CASCADE ON UPDATE CASCADE;

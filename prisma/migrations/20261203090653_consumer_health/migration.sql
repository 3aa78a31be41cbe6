-- AlterTable
ALTER TABLE "consumers" ADD COLUMN     "last_error" TEXT,
ADD COLUMN     "last_failure_at" TIMESTAMPTZ(3),
ADD COLUMN     "last_success_at" TIMESTAMPTZ(3);

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

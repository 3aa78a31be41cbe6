-- AlterTable
ALTER TABLE "consumers" ADD COLUMN     "max_concurrency" INTEGER,
ADD COLUMN     "rate_limit_per_second" DOUBLE PRECISION;

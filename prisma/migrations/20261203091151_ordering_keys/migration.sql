-- CreateEnum
CREATE TYPE "ordering" AS ENUM ('none', 'partition', 'key');

-- A group's ordering becomes one of three: `ordered` (a boolean) said none or partition, and is
-- carried over before it goes.
ALTER TABLE "consumer_groups" ADD COLUMN     "ordering" "ordering" NOT NULL DEFAULT 'none';
UPDATE "consumer_groups" SET "ordering" = 'partition' WHERE "ordered";

-- AlterTable
ALTER TABLE "consumer_groups" DROP COLUMN "ordered";

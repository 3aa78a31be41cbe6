-- AlterTable
ALTER TABLE "consumer_groups" ADD COLUMN     "push_timeout_set" BOOLEAN NOT NULL DEFAULT true;

-- Groups created before this column had no record of whether pushTimeoutMs was given. 10000 was
-- the default, and pushTimeoutMs <= ackTimeoutMs was enforced, so such a group's ackTimeoutMs is
-- at least 10000 and min(10000, ackTimeoutMs) = 10000: treating it as the default changes nothing
-- now and lets it follow a later, lower ackTimeoutMs.
UPDATE "consumer_groups" SET "push_timeout_set" = false WHERE "push_timeout_ms" = 10000;

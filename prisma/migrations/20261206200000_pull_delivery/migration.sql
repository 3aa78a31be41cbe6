-- Pull delivery (src/dispatch/pull-desk.ts): a group's messages are pushed to its consumers, or
-- taken by callers of POST /v1/groups/{group}/pull. A default on a new enum column rewrites no
-- table (PostgreSQL 11+ stores it in the catalogue).
CREATE TYPE "delivery_mode" AS ENUM ('push', 'pull');

ALTER TABLE "consumer_groups" ADD COLUMN "delivery" "delivery_mode" NOT NULL DEFAULT 'push';

-- Every broker process pushes for the partitions it owns (src/cluster/ownership.ts).
-- The owner of a (group, partition) holds a session advisory lock; owner_epoch is bumped by each new
-- owner (and by a seek), and every write that moves the partition forward names the epoch it holds,
-- so a process that lost the partition writes nothing for it.
ALTER TABLE "group_offsets" ADD COLUMN "owner_epoch" BIGINT NOT NULL DEFAULT 0;

-- The single leader is gone: every live process is a member, found through its lock session.
DROP TABLE "broker_leader";

CREATE TABLE "broker_members" (
    "backend_pid" INTEGER NOT NULL,
    "url" TEXT,
    "since" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "broker_members_pkey" PRIMARY KEY ("backend_pid")
);

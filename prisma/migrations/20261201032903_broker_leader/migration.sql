-- CreateTable
CREATE TABLE "broker_leader" (
    "id" INTEGER NOT NULL DEFAULT 1,
    "url" TEXT,
    "backend_pid" INTEGER NOT NULL,
    "since" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "broker_leader_pkey" PRIMARY KEY ("id")
);

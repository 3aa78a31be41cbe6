-- The `iss` of push JWTs, one per database, so every broker process signs with the same one: the
-- HOOKQ_PUBLIC_URL of the last process started with it, else the fallback URL of the first
-- process that started (docs/security.md "Push authentication").
CREATE TABLE "jwt_issuer" (
    "id" INTEGER NOT NULL DEFAULT 1,
    "issuer" TEXT NOT NULL,
    "recorded_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "jwt_issuer_pkey" PRIMARY KEY ("id"),
    CONSTRAINT "jwt_issuer_one_row" CHECK ("id" = 1)
);

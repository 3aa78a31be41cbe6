-- Push authentication per consumer (issue 32): its public part and its secret values, kept apart so
-- the secret values can be sealed (src/security/secrets.ts) while names stay readable.
ALTER TABLE "consumers" ADD COLUMN "auth" TEXT,
ADD COLUMN "auth_secret" TEXT;

-- The keys push JWTs are signed with; see src/dispatch/jwt-keys.ts for the rotation.
CREATE TABLE "jwt_keys" (
    "kid" TEXT NOT NULL,
    "alg" TEXT NOT NULL,
    "public_jwk" TEXT NOT NULL,
    "private_jwk" TEXT NOT NULL,
    "publish_at" TIMESTAMPTZ(3) NOT NULL,
    "sign_from" TIMESTAMPTZ(3) NOT NULL,
    "expires_at" TIMESTAMPTZ(3),
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "jwt_keys_pkey" PRIMARY KEY ("kid")
);

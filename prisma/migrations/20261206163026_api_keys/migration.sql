-- API keys made with POST /v1/keys, stored as SHA-256 digests (src/service/keys.ts).
CREATE TABLE "api_keys" (
    "id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "key_hash" BYTEA NOT NULL,
    "scopes" JSONB NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "expires_at" TIMESTAMPTZ(3),

    CONSTRAINT "api_keys_pkey" PRIMARY KEY ("id")
);

CREATE UNIQUE INDEX "api_keys_key_hash_key" ON "api_keys"("key_hash");

-- Every broker process polls this one row every second and reloads the keys when it moved, so a
-- deleted key is refused everywhere within ~1 s without a query per request. A counter row, not
-- max(created_at) or a sequence: the row lock orders the bumps, so a transaction that commits late
-- is never hidden behind one that committed before it.
CREATE TABLE "api_key_version" (
    "id" INTEGER NOT NULL DEFAULT 1,
    "version" BIGINT NOT NULL DEFAULT 0,

    CONSTRAINT "api_key_version_pkey" PRIMARY KEY ("id")
);

INSERT INTO "api_key_version" ("id", "version") VALUES (1, 0);

-- Any change, through the broker or by hand in psql (DELETE FROM api_keys ...), bumps the version.
CREATE FUNCTION hookq_api_keys_changed() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  UPDATE api_key_version SET version = version + 1 WHERE id = 1;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys
FOR EACH STATEMENT EXECUTE FUNCTION hookq_api_keys_changed();

-- Idempotency keys: only messages that carry one are indexed. Keyless messages (most of them) had
-- an index entry each that no lookup reads; it cost every produce an index insert (issue 10).
-- DropIndex
DROP INDEX "messages_topic_id_idempotency_key_key";

-- CreateIndex
CREATE UNIQUE INDEX "messages_topic_id_idempotency_key_key" ON "messages"("topic_id", "idempotency_key") WHERE (idempotency_key IS NOT NULL);

-- CreateTable
CREATE TABLE "produce_outbox" (
    "id" BIGSERIAL NOT NULL,
    "topic_id" INTEGER NOT NULL,
    "key" TEXT,
    "value" TEXT NOT NULL,
    "headers" TEXT NOT NULL DEFAULT '{}',
    "delay_ms" INTEGER NOT NULL DEFAULT 0,
    "idempotency_key" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT clock_timestamp(),

    CONSTRAINT "produce_outbox_pkey" PRIMARY KEY ("id")
);

-- The outbox is a queue: every row is inserted once and deleted once, soon after. Vacuum it by
-- row count rather than by a fraction of a table that is usually near empty.
ALTER TABLE "produce_outbox" SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                                  autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000);

-- hookq_produce: produces a message if and only if the caller's transaction commits (the contract's
-- "Transactional produce"). It checks its arguments as the HTTP API does and inserts one outbox row:
-- a plain INSERT, which takes no lock any other producer waits for, however long the caller's
-- transaction stays open afterwards. Offsets are handed out later, when the broker moves the row
-- into the log in a short transaction of its own (src/service/outbox.ts says how, and why that is
-- once and only once). Returns the outbox row's id: the offset is not known before the commit.
-- Errors use standard SQLSTATEs, and abort the caller's transaction like any failed statement:
-- 42704 (undefined_object) for an unknown topic, 22P02 for a value or headers that are not JSON,
-- 22023 (invalid_parameter_value) and 22004 (null_value_not_allowed) for the other arguments.
-- search_path is fixed to the broker's schema, so a caller's own search_path cannot redirect it.
CREATE FUNCTION hookq_produce(topic text, value text, key text DEFAULT NULL, headers text DEFAULT NULL,
                              delay_ms integer DEFAULT 0, idempotency_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
DECLARE
  topic_id integer;
  header_object json;
  outbox_id bigint;
BEGIN
  SELECT t.id INTO topic_id FROM topics t WHERE t.name = hookq_produce.topic;
  IF topic_id IS NULL THEN
    RAISE EXCEPTION 'hookq_produce: topic "%" does not exist', hookq_produce.topic
      USING ERRCODE = 'undefined_object', HINT = 'Create it first: PUT /v1/topics/{topic}.';
  END IF;
  IF hookq_produce.value IS NULL THEN
    RAISE EXCEPTION 'hookq_produce: value must not be NULL (a JSON null is the text ''null'')'
      USING ERRCODE = 'null_value_not_allowed';
  END IF;
  -- Parsed to check it is JSON; the text itself is stored (and pushed) as given.
  PERFORM hookq_produce.value::json;
  IF hookq_produce.headers IS NOT NULL THEN
    header_object := hookq_produce.headers::json;
    IF json_typeof(header_object) <> 'object' OR EXISTS (
      SELECT 1 FROM json_each(header_object) h
      WHERE json_typeof(h.value) <> 'string' OR length(h.key) NOT BETWEEN 1 AND 256
    ) THEN
      RAISE EXCEPTION 'hookq_produce: headers must be a JSON object of string values, with names of 1 to 256 characters'
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
  END IF;
  IF length(hookq_produce.key) > 4096 THEN
    RAISE EXCEPTION 'hookq_produce: key is % characters; at most 4096', length(hookq_produce.key)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF hookq_produce.delay_ms < 0 THEN
    RAISE EXCEPTION 'hookq_produce: delay_ms must be 0 or more, got %', hookq_produce.delay_ms
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF length(hookq_produce.idempotency_key) NOT BETWEEN 1 AND 512 THEN
    RAISE EXCEPTION 'hookq_produce: idempotency_key must be 1 to 512 characters'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- 256 MiB: the largest HOOKQ_MAX_MESSAGE_BYTES any broker can be set to.
  IF octet_length(hookq_produce.value) + coalesce(octet_length(hookq_produce.headers), 2) + coalesce(octet_length(hookq_produce.key), 0) > 268435456 THEN
    RAISE EXCEPTION 'hookq_produce: the message is over 256 MiB' USING ERRCODE = 'program_limit_exceeded';
  END IF;
  INSERT INTO produce_outbox (topic_id, key, value, headers, delay_ms, idempotency_key)
  VALUES (topic_id, hookq_produce.key, hookq_produce.value, coalesce(hookq_produce.headers, '{}'),
          coalesce(hookq_produce.delay_ms, 0), hookq_produce.idempotency_key)
  RETURNING id INTO outbox_id;
  RETURN outbox_id;
END
$fn$;

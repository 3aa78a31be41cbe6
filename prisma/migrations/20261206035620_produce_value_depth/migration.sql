-- hookq_produce refuses a value nested deeper than HTTP produce takes (128 levels): such a value,
-- once in the log, failed every read of its partition (issue 29). Otherwise as in the
-- transactional_produce migration, which says what the function does and why.
CREATE OR REPLACE FUNCTION hookq_produce(topic text, value text, key text DEFAULT NULL, headers text DEFAULT NULL,
                              delay_ms integer DEFAULT 0, idempotency_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
DECLARE
  topic_id integer;
  header_object json;
  outbox_id bigint;
  shape text;
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
  -- Nested no deeper than HTTP produce takes (128 levels of arrays and objects, src/http/json-body.ts):
  -- a deeper value could not be read back (JSON.stringify's stack). Fewer than 129 brackets cannot
  -- nest that deep (most values stop here); otherwise strings and scalars are removed and each pass
  -- removes the innermost empty pairs, one level a pass: 128 passes leave nothing unless it is deeper.
  IF length(hookq_produce.value) - length(translate(hookq_produce.value, '[{', '')) > 128 THEN
    shape := regexp_replace(regexp_replace(hookq_produce.value, '"(?:[^"\\]|\\.)*"', '', 'g'), '[^][{}]+', '', 'g');
    FOR pass IN 1..128 LOOP
      EXIT WHEN shape = '';
      shape := regexp_replace(shape, '\[\]|\{\}', '', 'g');
    END LOOP;
    IF shape <> '' THEN
      RAISE EXCEPTION 'hookq_produce: value nests more than 128 levels of arrays and objects'
        USING ERRCODE = 'invalid_parameter_value', HINT = 'HTTP produce refuses it too: flatten the value.';
    END IF;
  END IF;
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

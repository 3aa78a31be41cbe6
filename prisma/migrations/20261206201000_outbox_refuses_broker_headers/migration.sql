-- hookq_produce() refuses `hookq-dlq-*` headers (any case), as HTTP produce does
-- (src/service/produce.ts refuseBrokerHeadersOf): only the broker writes them, when it
-- dead-letters, and `hookq dlq replay` trusts them to say where a dead letter came from. Checked on
-- the outbox row itself (BEFORE INSERT, and UPDATE of its headers: an application could otherwise
-- rewrite a row in the transaction that wrote it), so any way into produce_outbox is checked, not
-- only the function, and hookq_produce's body stays as its own migrations wrote it.
-- Cheap for ordinary headers: the JSON is parsed only when its text holds `hookq-dlq-` in any case
-- or a backslash (an escaped name such as "\u0068ookq-dlq-x" decodes to one).
CREATE OR REPLACE FUNCTION hookq_outbox_refuse_broker_headers() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
  forged text;
BEGIN
  IF NEW.headers IS NOT NULL AND (strpos(lower(NEW.headers), 'hookq-dlq-') > 0 OR strpos(NEW.headers, '\') > 0) THEN
    SELECT h.key INTO forged FROM json_each_text(NEW.headers::json) h WHERE lower(h.key) LIKE 'hookq-dlq-%' LIMIT 1;
    IF forged IS NOT NULL THEN
      RAISE EXCEPTION 'hookq_produce: header "%" is the broker''s own (it says where a dead letter came from); produce cannot set hookq-dlq-* headers', forged
        USING ERRCODE = 'invalid_parameter_value', HINT = 'Only the broker writes hookq-dlq-* headers, when it dead-letters a message.';
    END IF;
  END IF;
  RETURN NEW;
END
$fn$;

CREATE TRIGGER produce_outbox_refuse_broker_headers BEFORE INSERT OR UPDATE OF headers ON produce_outbox
FOR EACH ROW EXECUTE FUNCTION hookq_outbox_refuse_broker_headers();

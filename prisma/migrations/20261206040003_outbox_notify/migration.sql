-- The broker waits for hookq_produce() rows on a notification instead of polling the outbox every
-- 50 ms (issue 29: an idle broker committed ~21 transactions a second). One NOTIFY per INSERT
-- statement into the outbox, sent by PostgreSQL when the caller's transaction commits and never
-- if it rolls back; repeats within a transaction fold into one (same channel, empty payload). The
-- broker's member sessions LISTEN on the channel; a slow poll remains for what a notification
-- cannot tell (src/service/outbox.ts says why, and what it costs a committing caller).
CREATE FUNCTION hookq_outbox_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
  PERFORM pg_notify('hookq_outbox', '');
  RETURN NULL;
END
$fn$;

CREATE TRIGGER produce_outbox_notify AFTER INSERT ON produce_outbox
FOR EACH STATEMENT EXECUTE FUNCTION hookq_outbox_notify();

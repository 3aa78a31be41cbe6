-- The outbox's NOTIFY only when a broker process waits for one. A transaction that NOTIFYs takes
-- PostgreSQL's notification lock at commit and holds it through its commit's WAL flush, so with a
-- NOTIFY per transaction concurrent hookq_produce() callers committed one at a time (8 callers:
-- ~440 commits/s, against ~1,750 without). A broker process that has nothing to move holds the
-- session advisory lock 0x686b7157 ("hkqW") exclusively while it waits; at commit each caller's
-- transaction tries it shared: taken (no process waits: the movers are busy and look again anyway)
-- it skips the NOTIFY, and holds the lock until its commit is visible, so a process about to wait
-- takes it only after that and then looks once more (src/service/outbox.ts). Refused (a process
-- waits, or is about to), it NOTIFYs. The check runs at commit (a deferred constraint trigger), so
-- an open transaction never holds the lock.
DROP TRIGGER produce_outbox_notify ON produce_outbox;

-- Only pg_catalog functions: no search_path to fix. Once per row, at commit: after the first row the
-- lock is this transaction's already (a lookup in its own lock table), and repeated NOTIFYs fold.
CREATE OR REPLACE FUNCTION hookq_outbox_notify() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
  IF NOT pg_try_advisory_xact_lock_shared(1751871831) THEN
    PERFORM pg_notify('hookq_outbox', '');
  END IF;
  RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER produce_outbox_notify AFTER INSERT ON produce_outbox
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION hookq_outbox_notify();

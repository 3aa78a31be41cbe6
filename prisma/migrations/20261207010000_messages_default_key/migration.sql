-- An upgraded database's messages_default gets the key a new database's has (issue 34).
--
-- A database that had messages before 20261206230000_message_chunks has a parent with no primary
-- key (one on it must hold produced_at, which messages_legacy's key lacks, and adding it would
-- build an index over the whole legacy table). Nothing relies on the parent's own constraint: no
-- statement on messages has ON CONFLICT, Prisma reads and writes none of it (its schema's @@id is
-- what a new database's migrations make, which is what Prisma's diff replays), each topic's tree
-- has the key, messages_legacy its own, and an offset is unique because produce hands it out under
-- its partition row's lock (the key, ending in produced_at, would not catch a repeat anyway).
-- But messages_default, made after the parent, inherited no key there: the rows of a topic whose
-- tree could not be made, read by (topic_id, partition, "offset") and filed into the tree by topic,
-- had only the (topic_id, produced_at) index. It holds such rows only until the next maintenance,
-- so the index is built at once; on a new database the partition has it already.
DO $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_index i
    WHERE i.indrelid = 'messages_default'::regclass AND i.indisunique
  ) THEN
    ALTER TABLE "messages_default" ADD CONSTRAINT "messages_default_pkey" PRIMARY KEY ("topic_id", "partition", "offset", "produced_at");
  END IF;
END
$$;

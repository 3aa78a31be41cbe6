#!/bin/bash
# Commits/s of 8 concurrent hookq_produce() callers (one call a transaction, pgbench -c 8, 15 s a
# run) with a broker running and moving the rows, under two bodies of the outbox trigger's function,
# alternating: "always" (a NOTIFY at every commit: the statement trigger of outbox_notify) and
# "when idle" (outbox_notify_when_idle: only while a broker process holds the wait lock).
set -e
SCRIPT=$(mktemp)
DB=outbox_notify_cost_$$
PSQL="psql -At -U postgres -h 127.0.0.1"
$PSQL -c "CREATE DATABASE $DB" >/dev/null
cd "$(dirname "$0")/.."
DATABASE_URL=postgresql://postgres@127.0.0.1:5432/$DB PORT=0 LOG_LEVEL=warn node --import tsx src/server.ts >/dev/null 2>&1 &
PID=$!
for i in $(seq 1 120); do n=$($PSQL -d $DB -c "SELECT count(*) FROM broker_members" 2>/dev/null || echo 0); [ "$n" = "1" ] && break; sleep 1; done
$PSQL -d $DB -c "INSERT INTO topics (name, partitions, retention_ms) VALUES ('bench', 1, 86400000); INSERT INTO topic_partitions (topic_id, partition) SELECT id, 0 FROM topics WHERE name = 'bench'" >/dev/null
echo "BEGIN; SELECT hookq_produce('bench', '{\"n\":1}'); COMMIT;" > "$SCRIPT"
always="CREATE OR REPLACE FUNCTION hookq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN PERFORM pg_notify('hookq_outbox', ''); RETURN NULL; END \$\$"
idle="CREATE OR REPLACE FUNCTION hookq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN IF NOT pg_try_advisory_xact_lock_shared(1751871831) THEN PERFORM pg_notify('hookq_outbox', ''); END IF; RETURN NULL; END \$\$"
for round in 1 2; do
  for mode in always idle; do
    if [ $mode = always ]; then $PSQL -d $DB -c "$always" >/dev/null; else $PSQL -d $DB -c "$idle" >/dev/null; fi
    tps=$(pgbench -n -h 127.0.0.1 -U postgres -c 8 -j 2 -T 15 -f "$SCRIPT" $DB 2>/dev/null | grep -oP 'tps = \K[0-9.]+' | head -1)
    left=$($PSQL -d $DB -c "SELECT count(*) FROM produce_outbox")
    echo "round $round notify $mode: $tps commits/s (outbox rows left at the end: $left)"
  done
done
moved=$($PSQL -d $DB -c "SELECT count(*) FROM messages")
kill $PID; wait $PID 2>/dev/null || true
echo "messages moved: $moved"
$PSQL -c "DROP DATABASE $DB WITH (FORCE)" >/dev/null

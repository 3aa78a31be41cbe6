#!/bin/bash
# Idle cost of one broker process with no topic: commits/s of its database (pg_stat_database
# xact_commit delta) and the broker's CPU (utime+stime from /proc/<pid>/stat), over $SECS seconds
# after a 10 s settle. Usage: bench/outbox-idle.sh [checkout] [label] (default: this checkout). PostgreSQL at 127.0.0.1:5432, user postgres.
set -e
WT=${1:-$(cd "$(dirname "$0")/.." && pwd)}; LABEL=${2:-idle}; SECS=${SECS:-30}
DB=outbox_idle_$$_$RANDOM
PSQL="psql -At -U postgres -h 127.0.0.1"
$PSQL -c "CREATE DATABASE $DB" >/dev/null
cd $WT
DATABASE_URL=postgresql://postgres@127.0.0.1:5432/$DB PORT=0 LOG_LEVEL=warn node --import tsx src/server.ts >/dev/null 2>&1 &
PID=$!
# ready when the migrations are applied and the member has joined: wait for its member row
for i in $(seq 1 120); do
  n=$($PSQL -d $DB -c "SELECT count(*) FROM broker_members" 2>/dev/null || echo 0)
  [ "$n" = "1" ] && break; sleep 1
done
sleep 10
TCK=$(getconf CLK_TCK)
c0=$($PSQL -c "SELECT xact_commit FROM pg_stat_database WHERE datname='$DB'")
t0=$(awk '{print $14+$15}' /proc/$PID/stat); s0=$(date +%s.%N)
sleep $SECS
c1=$($PSQL -c "SELECT xact_commit FROM pg_stat_database WHERE datname='$DB'")
t1=$(awk '{print $14+$15}' /proc/$PID/stat); s1=$(date +%s.%N)
kill $PID; wait $PID 2>/dev/null || true
$PSQL -c "DROP DATABASE $DB WITH (FORCE)" >/dev/null
echo "$LABEL: $(echo "($c1-$c0)/($s1-$s0)" | bc -l | xargs printf '%.1f') commits/s, broker CPU $(echo "100*($t1-$t0)/$TCK/($s1-$s0)" | bc -l | xargs printf '%.2f')% of a core over $(echo "$s1-$s0" | bc | xargs printf '%.0f') s"

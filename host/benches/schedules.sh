#!/usr/bin/env bash
# Drain of N messages of queue `bench` by the no-op handler on PostgreSQL, with nothing else
# configured (EXTRAS=off) or with schedules and a rate limit on *other* queues (EXTRAS=on):
# ten schedules ticking every second into a queue without a handler, and a queue `limited`
# (rate_limit = "100/s", burst 10) with a backlog of its own draining meanwhile, so its
# budget row is taken from all through the drain (EXTRAS=schedules or EXTRAS=limit: one of
# the two). Prints the drain rate of `bench`.
# Alternate the forms to compare:
#   WHARF=path/to/wharf NOOP=sample-handlers/target/wasm32-wasip2/release/noop.wasm \
#     EXTRAS=on host/benches/schedules.sh   (N=100000 messages by default)
# LIMITED=0 leaves `limited` without a backlog (configured, idle).
set -uo pipefail
WHARF=${WHARF:?}; NOOP=${NOOP:?}; N=${N:-100000}; EXTRAS=${EXTRAS:-off}; LIMITED=${LIMITED:-2000}
PG=postgres://postgres@127.0.0.1:5432/test
ADMIN=127.0.0.1:19805
now() { date +%s.%N; }
d=$(mktemp -d); mkdir -p "$d/handlers"; cp "$NOOP" "$d/handlers/noop.wasm"
schema=wharf_sc_t$$_$RANDOM
limit='[queues.limited]
handler = "noop"
rate_limit = "100/s"
burst = 10
'
schedules='[queues.ticks]
'
for i in $(seq 1 10); do
  schedules="$schedules
[schedules.pulse-$i]
cron = \"* * * * * *\"
queue = \"ticks\"
payload = { n = $i }
"
done
case "$EXTRAS" in
  off) extras="" ;;
  on) extras="$limit
$schedules" ;;
  limit) extras="$limit" ;;
  schedules) extras="$schedules" ;;
  *) echo "EXTRAS must be off, on, limit or schedules"; exit 2 ;;
esac
cat > "$d/wharf.toml" <<TOML
[host]
admin_listen = "$ADMIN"
[storage]
url = "$PG"
schema = "$schema"
max_connections = 16
[queues.bench]
handler = "noop"
$extras
TOML
cleanup() {
  psql -qtA "$PG" -c "drop schema if exists $schema cascade" >/dev/null 2>&1
  rm -rf "$d"
}
trap cleanup EXIT
seq 1 "$N" | awk '{printf "{\"n\":%d,\"pad\":\"abcdefghij\"}\n",$1}' > "$d/m.jsonl"
(cd "$d" && "$WHARF" enqueue bench --file m.jsonl >/dev/null 2>"$d/enq.err") || { echo "enqueue failed: $(tail -2 "$d/enq.err")"; exit 1; }
if { [ "$EXTRAS" = on ] || [ "$EXTRAS" = limit ]; } && [ "$LIMITED" -gt 0 ]; then
  # More than the drain lasts at 100 a second (it takes a few seconds).
  seq 1 "$LIMITED" | awk '{printf "{\"n\":%d}\n",$1}' > "$d/l.jsonl"
  (cd "$d" && "$WHARF" enqueue limited --file l.jsonl >/dev/null 2>"$d/enq.err") || { echo "enqueue failed: $(tail -2 "$d/enq.err")"; exit 1; }
fi
remaining() {
  psql -qtA "$PG" -c "select count(*) from $schema.messages where queue = 'bench' and status <> 'processed'" 2>/dev/null
}
(cd "$d" && exec "$WHARF" run >"$d/run.log" 2>&1) & pid=$!
hi=$((N*99/100)); lo=$((N/100)); ts=""; te=""; last=-1; moved=$(now)
while :; do
  r=$(remaining); [ -z "$r" ] && r=$N
  done_n=$((N - r)); t=$(now)
  [ -z "$ts" ] && [ $done_n -ge $lo ] && { ts=$t; ns=$done_n; }
  [ -n "$ts" ] && [ $done_n -ge $hi ] && { te=$t; ne=$done_n; break; }
  [ $done_n -ne $last ] && { last=$done_n; moved=$t; }
  [ "$(echo "$t - $moved > 30" | bc)" = 1 ] && break
  sleep 0.1
done
extra=""
if [ "$EXTRAS" != off ]; then
  extra=$(psql -qtA "$PG" -c "select ' ticks=' || count(*) filter (where queue = 'ticks') || ' limited_processed=' || count(*) filter (where queue = 'limited' and status = 'processed') from $schema.messages")
fi
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
if [ -z "$te" ]; then
  echo "extras=$EXTRAS: the drain stopped at $done_n of $N messages; the host's last lines:"
  tail -5 "$d/run.log"; exit 1
fi
rate=$(echo "($ne - $ns) / ($te - $ts)" | bc -l)
printf "extras=%s N=%d drain %.0f msg/s%s\n" "$EXTRAS" "$N" "$rate" "$extra"

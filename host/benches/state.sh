#!/usr/bin/env bash
# Drain of N messages whose handler (the `kv-state` fixture) increments one of 1,000
# key-value counters each (STATE=1 or OP=incr), against the same drain without state
# (STATE=0 or OP=none: the handler opens no bucket). OP=get reads one of 1,000 keys (absent),
# OP=set stages a set of one: their per-message cost is 1/rate - 1/rate(none).
# DB=postgres (default) or DB=sqlite; CONCURRENCY=N sets the queue's concurrency (default: the
# automatic one). Alternate the forms to compare:
#   WHARF=path/to/wharf KV=sample-handlers/target/wasm32-wasip2/release/kv_state.wasm \
#     OP=incr DB=postgres host/benches/state.sh   (N=100000 messages by default)
set -uo pipefail
WHARF=${WHARF:?}; KV=${KV:?}; N=${N:-100000}; STATE=${STATE:-1}; DB=${DB:-postgres}
PG=postgres://postgres@127.0.0.1:5432/test
now() { date +%s.%N; }
d=$(mktemp -d); mkdir -p "$d/handlers"; cp "$KV" "$d/handlers/kv.wasm"
tag=s$$_$RANDOM; schema=wharf_st_$tag
if [ "$DB" = postgres ]; then storage="url = \"$PG\"
schema = \"$schema\"
max_connections = 16"; else storage='url = "sqlite://wharf.db"'; fi
cat > "$d/wharf.toml" <<TOML
[host]
admin_listen = "127.0.0.1:19803"
[storage]
$storage
[handlers.kv]
keyvalue = ["counters"]
[queues.bench]
handler = "kv"
$([ -n "${CONCURRENCY:-}" ] && echo "concurrency = $CONCURRENCY")
TOML
OP=${OP:-$([ "$STATE" = 1 ] && echo incr || echo none)}
case "$OP" in
  incr) seq 1 "$N" | awk '{printf "{\"incr\":[\"k-%d\"]}\n",$1%1000}' > "$d/m.jsonl" ;;
  get) seq 1 "$N" | awk '{printf "{\"check\":{\"k-%d\":null}}\n",$1%1000}' > "$d/m.jsonl" ;;
  set) seq 1 "$N" | awk '{printf "{\"set\":{\"k-%d\":\"%d\"}}\n",$1%1000,$1}' > "$d/m.jsonl" ;;
  none) seq 1 "$N" | awk '{printf "{\"n\":%d}\n",$1}' > "$d/m.jsonl" ;;
  *) echo "OP must be incr, get, set or none"; exit 2 ;;
esac
(cd "$d" && "$WHARF" enqueue bench --file m.jsonl >/dev/null 2>"$d/enq.err") || { echo "enqueue failed: $(tail -2 $d/enq.err)"; exit 1; }
# Messages not yet processed, asked every 200 ms of one database session kept open for the
# whole run: a new psql every 50 ms, scanning every message, took a core's worth of the
# machine, and even this count takes ~20 ms of the server's time on PostgreSQL.
left="select count(*) from messages where queue = 'bench' and status in ('pending', 'sleeping', 'processing');"
if [ "$DB" = postgres ]; then coproc DBQ { psql -qtA "$PG" -c "set search_path = $schema" -f - 2>/dev/null; }
else coproc DBQ { sqlite3 -cmd ".timeout 5000" "$d/wharf.db" 2>/dev/null; }; fi
count() { echo "$left" >&"${DBQ[1]}"; local r; read -r -t 5 r <&"${DBQ[0]}"; echo "$r"; }
(cd "$d" && exec "$WHARF" run >"$d/run.log" 2>&1) & pid=$!
hi=$((N*99/100)); lo=$((N/100)); ts=""; te=""; last=-1; moved=$(now)
while :; do
  r=$(count); [ -z "$r" ] && r=$N
  done_n=$((N - r)); t=$(now)
  [ -z "$ts" ] && [ $done_n -ge $lo ] && { ts=$t; ns=$done_n; }
  [ -n "$ts" ] && [ $done_n -ge $hi ] && { te=$t; ne=$done_n; break; }
  [ $done_n -ne $last ] && { last=$done_n; moved=$t; }
  # No progress for 30 s: the drain is stuck (a handler that does not load, a full pool, …).
  [ "$(echo "$t - $moved > 30" | bc)" = 1 ] && break
  sleep 0.2
done
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; kill "$DBQ_PID" 2>/dev/null
if [ -z "$te" ] || [ "$(echo "$te > $ts" | bc)" != 1 ]; then
  echo "db=$DB op=$OP: the drain stopped at $done_n of $N messages; the host's last lines:"
  tail -5 "$d/run.log"
  [ "$DB" = postgres ] && psql -qtA "$PG" -c "drop schema if exists $schema cascade" >/dev/null 2>&1
  rm -rf "$d"; exit 1
fi
rate=$(echo "($ne - $ns) / ($te - $ts)" | bc -l)
printf "db=%s op=%s N=%d drain %.0f msg/s\n" "$DB" "$OP" "$N" "$rate"
[ "$DB" = postgres ] && psql -qtA "$PG" -c "drop schema if exists $schema cascade" >/dev/null 2>&1
rm -rf "$d"

#!/usr/bin/env bash
# Drain of N messages on PostgreSQL whose handler (the `flaky` fixture) enqueues one follow-up
# each into `replies`: TARGET=sql (a SQL queue of the same store) or TARGET=redis (an external
# queue: through the outbox). SOURCE=sql (default) drains a SQL queue; SOURCE=kafka drains a
# Kafka queue (tansu on 127.0.0.1:9092) into TARGET=sql, its progress read from `replies`.
# IDS=1 gives every message a MessageId (a broker source then commits with a commit mark);
# SEND_NOW=1 makes the handler send its follow-up at once (`wharf.send-now`, the path every
# follow-up took before they were staged), to compare both paths in one binary. Run two
# release binaries (or both paths) alternated to compare them:
#   WHARF=path/to/wharf FLAKY=sample-handlers/target/wasm32-wasip2/release/flaky.wasm \
#     N=20000 TARGET=sql host/benches/follow_ups.sh
set -uo pipefail
WHARF=${WHARF:?}; FLAKY=${FLAKY:?}; N=${N:-20000}; TARGET=${TARGET:-sql}; SOURCE=${SOURCE:-sql}
IDS=${IDS:-0}; SEND_NOW=${SEND_NOW:-0}
PG=postgres://postgres@127.0.0.1:5432/test
now() { date +%s.%N; }
d=$(mktemp -d); mkdir -p "$d/handlers"; cp "$FLAKY" "$d/handlers/flaky.wasm"
tag=f$$_$RANDOM; schema=wharf_fu_$tag; prefix="fu:$tag:"
rextra=""; [ "$TARGET" = redis ] && rextra='storage = "external"
provider = "r"'
sextra=""; [ "$SOURCE" = kafka ] && sextra='storage = "external"
provider = "k"'
cat > "$d/wharf.toml" <<TOML
[host]
admin_listen = "127.0.0.1:19802"
[storage]
url = "$PG"
schema = "$schema"
max_connections = 16
[queues.bench]
handler = "flaky"
concurrency = 64
batch = 256
$sextra
[queues.replies]
$rextra
[providers.r]
type = "redis"
url = "redis://127.0.0.1:6379"
key_prefix = "$prefix"
[providers.k]
type = "kafka"
brokers = "127.0.0.1:9092"
topic_prefix = "fu.$tag."
processing_group = "fu.$tag.processing"
readiness_group = "fu.$tag.readiness"
TOML
extra=""; [ "$SEND_NOW" = 1 ] && extra=',"send_now":true'
seq 1 "$N" | awk -v x="$extra" '{printf "{\"n\":%d,\"id\":\"m-%d\",\"reply_to\":\"replies\"%s}\n",$1,$1,x}' > "$d/m.jsonl"
ids=(); [ "$IDS" = 1 ] && ids=(--id-from /id)
(cd "$d" && "$WHARF" enqueue bench --file m.jsonl "${ids[@]}" >/dev/null 2>"$d/enq.err") || { echo "enqueue failed: $(tail -2 $d/enq.err)"; exit 1; }
remaining() {
  if [ "$SOURCE" = kafka ]; then echo $((N - $(psql -qtA "$PG" -c "select count(*) from $schema.messages where queue='replies'" 2>/dev/null || echo 0)))
  else psql -qtA "$PG" -c "select count(*) from $schema.messages where queue='bench' and status<>'processed'" 2>/dev/null; fi
}
replies() {
  if [ "$TARGET" = sql ]; then psql -qtA "$PG" -c "select count(*) from $schema.messages where queue='replies'" 2>/dev/null
  else redis-cli --raw eval "local t=0 for _,k in ipairs(redis.call('keys', ARGV[1]..'*')) do if redis.call('type',k).ok=='zset' then t=t+redis.call('zcard',k) end end return t" 0 "$prefix"; fi
}
(cd "$d" && exec "$WHARF" run >"$d/run.log" 2>&1) & pid=$!
hi=$((N*99/100)); lo=$((N/100)); ts=""; te=""
for i in $(seq 1 6000); do
  r=$(remaining); [ -z "$r" ] && r=$N
  done_n=$((N - r)); t=$(now)
  [ -z "$ts" ] && [ $done_n -ge $lo ] && { ts=$t; ns=$done_n; }
  [ -n "$ts" ] && [ $done_n -ge $hi ] && { te=$t; ne=$done_n; break; }
  sleep 0.05
done
# Follow-ups: wait until all N exist (published, for the broker target).
tf=""; for i in $(seq 1 1200); do [ "$(replies)" -ge "$N" ] 2>/dev/null && { tf=$(now); break; }; sleep 0.05; done
backlog=$(psql -qtA "$PG" -c "select count(*) from $schema.wharf_outbox" 2>/dev/null)
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
rate=$(echo "($ne - $ns) / ($te - $ts)" | bc -l)
lag=$(echo "$tf - $te" | bc -l 2>/dev/null)
printf "%s source=%s target=%s ids=%s send_now=%s N=%d drain %.0f msg/s  follow-ups %s, all present %.2f s after the drain, outbox left %s\n" "$(basename $WHARF)" "$SOURCE" "$TARGET" "$IDS" "$SEND_NOW" "$N" "$rate" "$(replies)" "${lag:-0}" "${backlog:-n/a}"
psql -qtA "$PG" -c "drop schema if exists $schema cascade" >/dev/null 2>&1
redis-cli --raw eval "for _,k in ipairs(redis.call('keys', ARGV[1]..'*')) do redis.call('del',k) end return 1" 0 "$prefix" >/dev/null
rm -rf "$d"

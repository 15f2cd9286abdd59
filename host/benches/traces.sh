#!/usr/bin/env bash
# Drain of N messages by the no-op handler with traces off (TRACES=off), configured but
# sampled at 0 (TRACES=zero), and sampled at 100 % to a local OTLP/HTTP receiver
# (TRACES=all; a Python server that answers every POST at once). DB=postgres (default: the
# SQL queue on PostgreSQL) or DB=redis (pending messages in Redis). Prints the drain rate and,
# with traces on, the host's exported and dropped span counts. Alternate the forms to compare:
#   WHARF=path/to/wharf NOOP=sample-handlers/target/wasm32-wasip2/release/noop.wasm \
#     TRACES=all DB=postgres host/benches/traces.sh   (N=100000 messages by default)
set -uo pipefail
WHARF=${WHARF:?}; NOOP=${NOOP:?}; N=${N:-100000}; TRACES=${TRACES:-off}; DB=${DB:-postgres}
PG=postgres://postgres@127.0.0.1:5432/test
ADMIN=127.0.0.1:19804; RECEIVER_PORT=${RECEIVER_PORT:-14318}
now() { date +%s.%N; }
d=$(mktemp -d); mkdir -p "$d/handlers"; cp "$NOOP" "$d/handlers/noop.wasm"
tag=t$$_$RANDOM; schema=wharf_tr_$tag; prefix="wt:$tag:"
case "$TRACES" in
  off) telemetry="" ;;
  zero) telemetry="[telemetry]
traces = true
endpoint = \"http://127.0.0.1:$RECEIVER_PORT\"
sample_ratio = 0.0" ;;
  all) telemetry="[telemetry]
traces = true
endpoint = \"http://127.0.0.1:$RECEIVER_PORT\"
sample_ratio = 1.0
max_queued_spans = ${MAX_QUEUED_SPANS:-8192}" ;;
  *) echo "TRACES must be off, zero or all"; exit 2 ;;
esac
queue_storage=""; providers=""
if [ "$DB" = redis ]; then
  queue_storage='storage = "external"
provider = "r"'
  providers="[providers.r]
type = \"redis\"
url = \"redis://127.0.0.1:6379\"
key_prefix = \"$prefix\""
fi
cat > "$d/wharf.toml" <<TOML
[host]
admin_listen = "$ADMIN"
[storage]
url = "$PG"
schema = "$schema"
max_connections = 16
$telemetry
[queues.bench]
handler = "noop"
$queue_storage
$providers
TOML
# The receiver: answers every export with an empty success at once.
python3 - "$RECEIVER_PORT" > "$d/receiver.log" 2>&1 <<'PY' &
import sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Receiver).serve_forever()
PY
receiver=$!
cleanup() {
  kill "$receiver" 2>/dev/null
  psql -qtA "$PG" -c "drop schema if exists $schema cascade" >/dev/null 2>&1
  [ "$DB" = redis ] && redis-cli --raw eval "for _,k in ipairs(redis.call('keys', ARGV[1]..'*')) do redis.call('del',k) end return 1" 0 "$prefix" >/dev/null
  rm -rf "$d"
}
trap cleanup EXIT
seq 1 "$N" | awk '{printf "{\"n\":%d,\"pad\":\"abcdefghij\"}\n",$1}' > "$d/m.jsonl"
(cd "$d" && "$WHARF" enqueue bench --file m.jsonl ${ENQUEUE_ARGS:-} >/dev/null 2>"$d/enq.err") || { echo "enqueue failed: $(tail -2 "$d/enq.err")"; exit 1; }
remaining() {
  if [ "$DB" = redis ]; then
    redis-cli --raw eval "local t=0 for _,k in ipairs(redis.call('keys', ARGV[1]..'*')) do if redis.call('type',k).ok=='zset' then t=t+redis.call('zcard',k) end end return t" 0 "$prefix"
  else
    psql -qtA "$PG" -c "select count(*) from $schema.messages where status <> 'processed'" 2>/dev/null
  fi
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
spans=""
if [ "$TRACES" != off ]; then
  # What the host exported and dropped once the drain is over (queued spans leave within
  # the exporter's linger).
  sleep 1
  spans=$(curl -s "http://$ADMIN/metrics" | awk '/^wharf_trace_spans_(exported|dropped)_total/ {printf " %s=%s", $1, $2}')
fi
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
if [ -z "$te" ]; then
  echo "db=$DB traces=$TRACES: the drain stopped at $done_n of $N messages; the host's last lines:"
  tail -5 "$d/run.log"; exit 1
fi
rate=$(echo "($ne - $ns) / ($te - $ts)" | bc -l)
printf "db=%s traces=%s N=%d drain %.0f msg/s%s\n" "$DB" "$TRACES" "$N" "$rate" "$spans"

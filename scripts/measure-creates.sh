#!/usr/bin/env bash
# Creates a second with wrk: items with three grants and one declared sort
# index (and optionally a text index), against GET /api/v1/health in the
# same run, at 1, 16 and 200 connections; and how many commits share one
# fsync (the SQLite store's commit groups, from /metrics).
#   scripts/measure-creates.sh [text]   (needs wrk: apt-get install wrk)
# BIN=path/to/tarn measures that binary instead of building this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
TEXT=${1:-}
DUR=${DUR:-10s}
if [ -z "${BIN:-}" ]; then cargo build --release -p tarn >/dev/null; BIN=./target/release/tarn; fi
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
API=http://127.0.0.1:$PORT/api/v1
TARN_ADMIN_PASSWORD=measure-admin RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do curl -sf $API/health >/dev/null && break; sleep 0.1; done
J='content-type: application/json'
token() { curl -s -XPOST $API/sessions -H "$J" -d "{\"username\":\"$1\",\"password\":\"$2\"}" | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])'; }
for u in writer a b; do
  curl -s -XPOST $API/users -H "$J" -d "{\"username\":\"$u\",\"password\":\"$u-password\"}" >/dev/null
done
ADMIN=$(token admin measure-admin)
WRITER=$(token writer writer-password)
curl -s -XPOST $API/groups -H "authorization: Bearer $WRITER" -H "$J" -d '{"id":"team"}' >/dev/null
curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" -H "$J" \
  -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
if [ -n "$TEXT" ]; then
  curl -s -XPUT $API/indexes/doc-text -H "authorization: Bearer $ADMIN" -H "$J" \
    -d '{"kind":"doc","text":[{"field":"title","weight":3},{"field":"description"}]}' >/dev/null
fi
until curl -s $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" | grep -q '"ready"'; do sleep 0.2; done
cat > "$DIR/create.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"kind":"doc","properties":{"rank":7,"title":"quarterly report draft","description":"the quick brown fox jumps over the lazy dog while the team reviews numbers for the quarter"},"acl":[{"principal":"user:a","role":"viewer"},{"principal":"user:b","role":"editor"},{"principal":"group:team","role":"viewer"}]}'
LUA
metric() { curl -s http://127.0.0.1:$PORT/metrics | awk -v m="$1" '$1 == m {print $2}'; }
echo "cores: $(nproc); $(date -u +%Y-%m-%d); text index: ${TEXT:-no}"
printf '%-8s %5s %12s %10s %8s %16s\n' target conns "requests/s" "p99" ratio "commits/fsync"
for C in 1 16 200; do
  T=$(( C < 2 ? 1 : 2 ))
  OUT=$(wrk -t$T -c$C -d$DUR --latency "$API/health")
  H=$(echo "$OUT" | awk '/Requests\/sec/ {print $2}')
  HP=$(echo "$OUT" | awk '$1=="99%" {print $2}')
  printf '%-8s %5s %12s %10s %8s\n' health $C "$H" "$HP" 1.00
  C0=$(metric tarn_store_sqlite_commits_total); G0=$(metric tarn_store_sqlite_commit_groups_total)
  OUT=$(wrk -t$T -c$C -d$DUR --latency -s "$DIR/create.lua" -H "authorization: Bearer $WRITER" "$API/items")
  C1=$(metric tarn_store_sqlite_commits_total); G1=$(metric tarn_store_sqlite_commit_groups_total)
  R=$(echo "$OUT" | awk '/Requests\/sec/ {print $2}')
  P=$(echo "$OUT" | awk '$1=="99%" {print $2}')
  NON=$(echo "$OUT" | awk '/Non-2xx/ {print $NF}')
  RATIO=$(python3 -c "print(f'{$R/$H:.3f}')")
  PER=$(python3 -c "print(f'{($C1-$C0)/max(1,$G1-$G0):.1f}')")
  printf '%-8s %5s %12s %10s %8s %16s %s\n' create $C "$R" "$P" "$RATIO" "$PER" "${NON:+non-2xx: $NON}"
done

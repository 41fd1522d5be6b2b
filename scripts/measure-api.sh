#!/usr/bin/env bash
# Requests/s and p99 of health, an item read, a sorted 25-item listing and /me,
# at 16 and 200 connections, with wrk against a release build on loopback.
# Usage: scripts/measure-api.sh [ITEMS]   (needs wrk: apt-get install wrk)
# BIN=path/to/tarn measures that binary instead of building this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ITEMS=${1:-2000}
DUR=${DUR:-10s}
if [ -z "${BIN:-}" ]; then cargo build --release -p tarn >/dev/null; BIN=./target/release/tarn; fi
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
API=http://127.0.0.1:$PORT/api/v1
TARN_ADMIN_PASSWORD=measure-admin RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:$PORT --data "$DIR" >/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
sleep 1
J='content-type: application/json'
token() { curl -s -XPOST $API/sessions -H "$J" -d "{\"username\":\"$1\",\"password\":\"$2\"}" | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])'; }
curl -s -XPOST $API/users -H "$J" -d '{"username":"reader","password":"reader-password"}' >/dev/null
ADMIN=$(token admin measure-admin)
READER=$(token reader reader-password)
curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" -H "$J" \
  -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
until curl -s $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" | grep -q '"ready"'; do sleep 0.5; done
python3 - "$API" "$ADMIN" "$ITEMS" <<'PY'
import json, sys, urllib.request, concurrent.futures
api, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def make(i):
    body = json.dumps({"kind": "doc", "properties": {"rank": (i * 7919) % 100000, "title": f"doc {i}"},
                       "acl": [{"principal": "everyone", "role": "viewer"}]}).encode()
    req = urllib.request.Request(api + "/items", body, {"content-type": "application/json", "authorization": "Bearer " + token})
    return json.load(urllib.request.urlopen(req))["id"]
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    ids = list(ex.map(make, range(n)))
open("/tmp/tarn-measure-id", "w").write(ids[n // 2])
PY
ID=$(cat /tmp/tarn-measure-id)
echo "items: $ITEMS; cores: $(nproc); $(date -u +%Y-%m-%d)"
printf '%-10s %5s %12s %10s %8s\n' target conns "requests/s" "p99" ratio
for C in 16 200; do
  declare -A RPS=()
  for T in health item listing me; do
    case $T in
      health) URL=$API/health ;;
      item) URL=$API/items/$ID ;;
      listing) URL="$API/items?kind=doc&sort=rank&limit=25" ;;
      me) URL=$API/me ;;
    esac
    OUT=$(wrk -t2 -c$C -d$DUR --latency -H "authorization: Bearer $READER" "$URL")
    R=$(echo "$OUT" | awk '/Requests\/sec/ {print $2}')
    P99=$(echo "$OUT" | awk '$1=="99%" {print $2}')
    NON2XX=$(echo "$OUT" | awk '/Non-2xx/ {print $NF}')
    RPS[$T]=$R
    RATIO=$(python3 -c "print(f'{$R/${RPS[health]}:.2f}')")
    printf '%-10s %5s %12s %10s %8s %s\n' $T $C "$R" "$P99" "$RATIO" "${NON2XX:+non-2xx: $NON2XX}"
  done
done

#!/usr/bin/env bash
# Where a create's cost goes on the SQLite store: creates with three grants
# and one declared sort index under wrk (as scripts/measure-creates.sh), on a
# fresh release server per run, and from /proc, per create: the server's CPU,
# the writer thread's CPU (the one thread every write passes through), and
# the writer's and the checkpointer's write syscalls and bytes (WAL frames
# are two pwrites each: a header and a page).
#   scripts/measure-create-cost.sh [CONNS...]   (default: 1 16 200; needs wrk)
# DOCS=1 gives each create a title of 3 words and a description of 110,
# drawn from 20,000 with a heavy head (about the search workload's mean
# document); TEXT=1 also declares a text index on title (weight 3) and
# description.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-8}
[ $# -gt 0 ] || set -- 1 16 200
if [ -z "${BIN:-}" ]; then cargo build --release -p tarn >/dev/null; BIN=./target/release/tarn; fi
J='content-type: application/json'
tick=$(getconf CLK_TCK)
printf '%6s %10s %14s %14s %12s %14s %14s\n' conns creates/s "server µs/op" "writer µs/op" "writer busy" "WAL KiB/op" "writes/op"
for C in "$@"; do
  DIR=$(mktemp -d)
  PORT=$((20000 + RANDOM % 20000))
  API=http://127.0.0.1:$PORT/api/v1
  TARN_ADMIN_PASSWORD=measure-admin RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null &
  PID=$!
  trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
  for _ in $(seq 1 100); do curl -sf $API/health >/dev/null && break; sleep 0.1; done
  token() { curl -s -XPOST $API/sessions -H "$J" -d "{\"username\":\"$1\",\"password\":\"$2\"}" | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])'; }
  for u in writer a b; do
    curl -s -XPOST $API/users -H "$J" -d "{\"username\":\"$u\",\"password\":\"$u-password\"}" >/dev/null
  done
  ADMIN=$(token admin measure-admin)
  WRITER=$(token writer writer-password)
  curl -s -XPOST $API/groups -H "authorization: Bearer $WRITER" -H "$J" -d '{"id":"team"}' >/dev/null
  curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" -H "$J" \
    -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
  until curl -s $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" | grep -q '"ready"'; do sleep 0.2; done
  if [ -n "${TEXT:-}" ]; then
    curl -s -XPUT $API/indexes/doc-text -H "authorization: Bearer $ADMIN" -H "$J" \
      -d '{"kind":"doc","text":[{"field":"title","weight":3},{"field":"description"}]}' >/dev/null
    until curl -s $API/indexes/doc-text -H "authorization: Bearer $ADMIN" | grep -q '"ready"'; do sleep 0.2; done
  fi
  if [ -n "${DOCS:-}" ]; then
    cat > "$DIR/create.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
-- 110 words, drawn from 20,000 with a heavy head, so rows land all over
-- the index as in the search workload.
local function word()
  local r = math.floor(20000 ^ math.random())
  return "w" .. r .. "x"
end
request = function()
  local d = {}
  for i = 1, 110 do d[i] = word() end
  local body = '{"kind":"doc","properties":{"rank":7,"title":"' .. word() .. ' ' .. word() .. ' ' .. word() ..
    '","description":"' .. table.concat(d, " ") .. '"},"acl":[{"principal":"user:a","role":"viewer"},' ..
    '{"principal":"user:b","role":"editor"},{"principal":"group:team","role":"viewer"}]}'
  return wrk.format(nil, nil, nil, body)
end
LUA
  else
    cat > "$DIR/create.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"kind":"doc","properties":{"rank":7,"title":"quarterly report draft","description":"the quick brown fox jumps over the lazy dog while the team reviews numbers for the quarter"},"acl":[{"principal":"user:a","role":"viewer"},{"principal":"user:b","role":"editor"},{"principal":"group:team","role":"viewer"}]}'
LUA
  fi
  task() { grep -l "^$1" /proc/$PID/task/*/comm | head -1 | xargs dirname; }
  W=$(task sqlite-write); K=$(task sqlite-checkpoi)
  cpu() { awk '{print $14 + $15}' "$1/stat"; }
  io() { awk '$1 == "wchar:" {b=$2} $1 == "syscw:" {n=$2} END {print b, n}' "$1/io"; }
  p0=$(cpu /proc/$PID); w0=$(cpu $W); read wb0 wn0 < <(io $W); read kb0 kn0 < <(io $K)
  T=$(( C < 2 ? 1 : 2 ))
  OUT=$(wrk -t$T -c$C -d${DUR}s -s "$DIR/create.lua" -H "authorization: Bearer $WRITER" "$API/items")
  p1=$(cpu /proc/$PID); w1=$(cpu $W); read wb1 wn1 < <(io $W); read kb1 kn1 < <(io $K)
  N=$(echo "$OUT" | awk '/requests in/ {print $1}')
  python3 - "$C" "$N" "$DUR" "$tick" "$p0" "$p1" "$w0" "$w1" "$wb0" "$wb1" "$wn0" "$wn1" "$kn0" "$kn1" <<'PY'
import sys
c, n, dur, tick = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
p0, p1, w0, w1, wb0, wb1, wn0, wn1, kn0, kn1 = map(int, sys.argv[5:])
us = 1e6 / tick
print(f"{c:6d} {n / dur:10.0f} {(p1 - p0) * us / n:14.1f} {(w1 - w0) * us / n:14.1f} "
      f"{(w1 - w0) / tick / dur:12.2f} {(wb1 - wb0) / 1024 / n:14.1f} "
      f"{(wn1 - wn0) / n:7.1f} + {(kn1 - kn0) / n:.1f}")
PY
  kill $PID; wait $PID 2>/dev/null || true; rm -rf "$DIR"; trap - EXIT
done
echo "writes/op: the writer's write syscalls + the checkpointer's, a create; $(nproc) cores, $(date -u +%Y-%m-%d)"

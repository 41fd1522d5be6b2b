#!/usr/bin/env bash
# Where an upload's CPU goes: wrk PUTs 256 KiB bodies into one item (each
# replaces the last) against a release `tarn serve`, at 1 and 12
# connections, and prints uploads a second, MiB a second and the server's
# CPU per upload, split by thread (tokio workers: HTTP, hashing, item
# reads; the SQLite writer; the checkpointer), read from /proc before and
# after. No readers run, so uploads never rest (`upload_share` applies only
# while the node serves others).
#   scripts/measure-upload-cost.sh [CONNS...]   (needs wrk: apt-get install wrk)
# BIN=path/to/tarn measures that binary instead of building this checkout;
# DUR=10s sets each run's length.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${*:-1 12}
DUR=${DUR:-10s}
if [ -z "${BIN:-}" ]; then cargo build --release -p tarn >/dev/null; BIN=./target/release/tarn; fi
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
API=http://127.0.0.1:$PORT/api/v1
RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do curl -sf $API/health >/dev/null && break; sleep 0.1; done
J='content-type: application/json'
curl -s -XPOST $API/users -H "$J" -d '{"username":"uploader","password":"uploader-password"}' >/dev/null
TOKEN=$(curl -s -XPOST $API/sessions -H "$J" -d '{"username":"uploader","password":"uploader-password"}' \
  | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])')
ID=$(curl -s -XPOST $API/items -H "authorization: Bearer $TOKEN" -H "$J" -d '{"kind":"file"}' \
  | python3 -c 'import sys,json;print(json.load(sys.stdin)["id"])')
python3 -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(256 * 1024)))' >"$DIR/body"
cat >"$DIR/put.lua" <<EOF
local f = io.open("$DIR/body", "rb")
wrk.body = f:read("*all")
f:close()
wrk.method = "PUT"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Authorization"] = "Bearer $TOKEN"
EOF
# CPU ticks of the server's threads, summed by thread name.
threads() {
  for t in /proc/$PID/task/*; do
    echo "$(cat "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
  done | awk '{s[$1] += $NF} END {for (k in s) print k, s[k]}'
}
HZ=$(getconf CLK_TCK)
echo "256 KiB uploads into one item; cores: $(nproc); $(date -u +%Y-%m-%d)"
for C in $CONNS; do
  before=$(threads)
  OUT=$(wrk -t1 -c"$C" -d"$DUR" -s "$DIR/put.lua" "$API/items/$ID/body")
  after=$(threads)
  N=$(echo "$OUT" | awk '/requests in/ {print $1}')
  SECS=$(echo "$OUT" | awk '/requests in/ {sub(/s,$/, "", $4); print $4}')
  NON2XX=$(echo "$OUT" | awk '/Non-2xx/ {print $NF}')
  python3 - "$C" "$N" "$SECS" "$HZ" "${NON2XX:-0}" <<PY
import sys
c, n, secs, hz, bad = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def parse(text):
    return {l.rsplit(' ', 1)[0]: int(l.rsplit(' ', 1)[1]) for l in text.strip().splitlines()}
b, a = parse("""$before"""), parse("""$after""")
used = {k: (a[k] - b.get(k, 0)) * 1000 / hz / max(n, 1) for k in a}
total = sum(used.values())
split = ', '.join(f'{k} {v:.2f}' for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.01)
print(f'{c:>3} connections: {n / secs:7.1f} uploads/s, {n / secs / 4:6.1f} MiB/s, '
      f'server CPU {total:.2f} ms an upload ({split}){"; non-2xx: " + bad if bad != "0" else ""}')
PY
done

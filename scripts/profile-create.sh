#!/usr/bin/env bash
# Where a create's time goes: runs a release `tarn serve` under valgrind's
# callgrind (instruction counts: repeatable whatever else the machine does),
# makes N creates with three grants and a declared sort index, and prints
# the instructions per create and the functions that take them.
#   scripts/profile-create.sh [N] [text]   (needs valgrind; apt-get install valgrind)
# With `text`, a text index on the items' title and description is declared
# too, to see what search costs a write.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-300}
TEXT=${2:-}
command -v valgrind >/dev/null || { echo "profile-create: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -p tarn >/dev/null
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
API=http://127.0.0.1:$PORT/api/v1
OUT="$DIR/callgrind.out"
TARN_ADMIN_PASSWORD=profile-admin RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$OUT" ./target/release/tarn serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null 2>"$DIR/valgrind.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $DIR" || rm -rf "$DIR"' EXIT
for _ in $(seq 1 300); do curl -sf $API/health >/dev/null && break; sleep 0.2; done
J='content-type: application/json'
token() { curl -s -XPOST $API/sessions -H "$J" -d "{\"username\":\"$1\",\"password\":\"$2\"}" | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])'; }
for u in writer a b; do
  curl -s -XPOST $API/users -H "$J" -d "{\"username\":\"$u\",\"password\":\"$u-password\"}" >/dev/null
done
ADMIN=$(token admin profile-admin)
WRITER=$(token writer writer-password)
curl -s -XPOST $API/groups -H "authorization: Bearer $WRITER" -H "$J" -d '{"id":"team"}' >/dev/null
curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" -H "$J" \
  -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
if [ -n "$TEXT" ]; then
  curl -s -XPUT $API/indexes/doc-text -H "authorization: Bearer $ADMIN" -H "$J" \
    -d '{"kind":"doc","text":[{"field":"title","weight":3},{"field":"description"}]}' >/dev/null
fi
sleep 2
BODY='{"kind":"doc","properties":{"rank":7,"title":"quarterly report draft","description":"the quick brown fox jumps over the lazy dog while the team reviews numbers for the quarter and plans the next release of the product"},"acl":[{"principal":"user:a","role":"viewer"},{"principal":"user:b","role":"editor"},{"principal":"group:team","role":"viewer"}]}'
# Warm up, then count only the measured creates.
for _ in $(seq 1 20); do curl -s -XPOST $API/items -H "authorization: Bearer $WRITER" -H "$J" -d "$BODY" >/dev/null; done
callgrind_control -i on $PID >/dev/null
for _ in $(seq 1 "$N"); do curl -s -XPOST $API/items -H "authorization: Bearer $WRITER" -H "$J" -d "$BODY" >/dev/null; done
callgrind_control -i off $PID >/dev/null
callgrind_control -d $PID >/dev/null
sleep 1
TOTAL=$(callgrind_annotate "$OUT.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
echo "creates: $N; instructions per create: $((TOTAL / N)) (all threads of the server)"
echo
echo "inclusive cost by function (top 40):"
callgrind_annotate --inclusive=yes "$OUT.1" 2>/dev/null | sed -n '/file:function/,$p' | sed -n 2,46p | cut -c1-200

#!/usr/bin/env bash
# Where a read's time goes: runs a release `tarn serve` under valgrind's
# callgrind (instruction counts: repeatable whatever else the machine does)
# and prints the instructions per request of /health, an item read, a sorted
# 25-item listing and /me (the requests of scripts/measure-api.sh), each as a
# ratio to /health, then the functions that take the most of one of them.
#   scripts/profile-read.sh [N] [item|listing|me]   (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
SHOW=${2:-item}
command -v valgrind >/dev/null || { echo "profile-read: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -p tarn >/dev/null
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
API=http://127.0.0.1:$PORT/api/v1
OUT="$DIR/callgrind.out"
TARN_ADMIN_PASSWORD=profile-admin RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$OUT" ./target/release/tarn serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null 2>"$DIR/valgrind.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $DIR" || rm -rf "$DIR"' EXIT
for _ in $(seq 1 600); do curl -sf $API/health >/dev/null && break; sleep 0.2; done
J='content-type: application/json'
token() { curl -s -XPOST $API/sessions -H "$J" -d "{\"username\":\"$1\",\"password\":\"$2\"}" | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])'; }
curl -s -XPOST $API/users -H "$J" -d '{"username":"reader","password":"reader-password"}' >/dev/null
ADMIN=$(token admin profile-admin)
READER=$(token reader reader-password)
curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" -H "$J" \
  -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
until curl -s $API/indexes/doc-by-rank -H "authorization: Bearer $ADMIN" | grep -q '"ready"'; do sleep 0.5; done
for i in $(seq 1 60); do
  ID=$(curl -s -XPOST $API/items -H "authorization: Bearer $ADMIN" -H "$J" \
    -d "{\"kind\":\"doc\",\"properties\":{\"rank\":$(( (i * 7919) % 1000 )),\"title\":\"doc $i\"},\"acl\":[{\"principal\":\"everyone\",\"role\":\"viewer\"}]}" \
    | python3 -c 'import sys,json;print(json.load(sys.stdin)["id"])')
done
declare -A PER=()
n=0
for what in health item listing me; do
  case $what in
    health) URL=$API/health ;;
    item) URL=$API/items/$ID ;;
    listing) URL="$API/items?kind=doc&sort=rank&limit=25" ;;
    me) URL=$API/me ;;
  esac
  for _ in $(seq 1 20); do curl -s -H "authorization: Bearer $READER" "$URL" >/dev/null; done
  callgrind_control -z $PID >/dev/null
  callgrind_control -i on $PID >/dev/null
  for _ in $(seq 1 "$N"); do curl -s -H "authorization: Bearer $READER" "$URL" >/dev/null; done
  callgrind_control -i off $PID >/dev/null
  callgrind_control -d $what $PID >/dev/null
  n=$((n + 1))
  sleep 1
  F=$OUT.$n
  T=$(callgrind_annotate "$F" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  PER[$what]=$((T / N))
  cp "$F" "$DIR/$what.callgrind"
done
printf '%-8s %14s %8s\n' request "instr/request" "×health"
for what in health item listing me; do
  printf '%-8s %14d %8.2f\n' $what ${PER[$what]} "$(python3 -c "print(${PER[health]}/${PER[$what]})")"
done
echo
echo "Functions, inclusive, of $SHOW ($N requests):"
callgrind_annotate --inclusive=${INCLUSIVE:-yes} "$DIR/$SHOW.callgrind" 2>/dev/null | sed -n '/file:function/,$p' | sed -n 2,80p | cut -c1-200

#!/usr/bin/env bash
# Where a search's time goes: loads the search workload's documents (the
# kit's quick run, 5,000 documents, through a release `tarn serve`), then
# serves N searches by one of the kit's readers under valgrind's callgrind
# (instruction counts: repeatable whatever else the machine does) and prints
# the instructions per search and the functions that take the most.
#   scripts/profile-search.sh [all|prefix|prefix1...] [N]   (needs valgrind)
# prefix: search-as-you-type prefixes of 2-5 letters, as the kit sends;
# prefix1: of one letter. Several kinds, quoted ("prefix prefix1"), are
# profiled one after the other on the same documents.
set -euo pipefail
cd "$(dirname "$0")/.."
KINDS=${1:-all}
N=${2:-200}
command -v valgrind >/dev/null || { echo "profile-search: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -p tarn >/dev/null
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
URL=http://127.0.0.1:$PORT
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"' EXIT
wait_up() { for _ in $(seq 1 600); do curl -sf $URL/api/v1/health >/dev/null && return; sleep 0.2; done; echo "server did not start" >&2; exit 1; }
export TARN_ADMIN_PASSWORD=profile-admin RUST_LOG=warn
./target/release/tarn serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null & PID=$!
wait_up
./target/release/tarn bench search --quick --url $URL --out "$DIR/load" >/dev/null
kill $PID; wait $PID || true
for KIND in $KINDS; do
  OUT="$DIR/callgrind-$KIND.out"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT" \
    ./target/release/tarn serve --listen 127.0.0.1:$PORT --data "$DIR/data" >/dev/null 2>"$DIR/valgrind.log" & PID=$!
  wait_up
  TOKEN=$(curl -s -XPOST $URL/api/v1/sessions -H 'content-type: application/json' \
    -d '{"username":"searcher0","password":"searcher-password"}' | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])')
  # The kit's words (crates/bench/src/workloads/search.rs): common, medium
  # and rare ranks of its vocabulary; prefixes of 2-5 letters.
  python3 - "$KIND" $((N + 20)) > "$DIR/paths" <<'PY'
import random, sys
ONSET = "b c d f g h j k l m n p r s t v".split(); VOWEL = "a e i o u".split()
def word(rank):
    n, w = rank + 1, ""
    while n > 0:
        w += ONSET[n % 16]; n //= 16; w += VOWEL[n % 5]; n //= 5
    return w + "x"
def banded(r):
    k = r.randrange(3)
    return word(r.randrange(100) if k == 0 else 100 + r.randrange(1900) if k == 1 else 2000 + r.randrange(18000))
r = random.Random(7)
for _ in range(int(sys.argv[2])):
    if sys.argv[1] == "prefix1":
        print(f"/api/v1/search?kind=document&limit=20&prefix=true&q={word(r.randrange(2000))[0]}")
    elif sys.argv[1] == "prefix":
        w = word(r.randrange(2000))
        print(f"/api/v1/search?kind=document&limit=20&prefix=true&q={w[:min(2 + r.randrange(4), len(w))]}")
    else:
        q = "%20".join(banded(r) for _ in range(1 + r.randrange(3)))
        print(f"/api/v1/search?kind=document&limit=20&q={q}")
PY
  head -20 "$DIR/paths" | while read -r p; do curl -sf "$URL$p" -H "authorization: Bearer $TOKEN" >/dev/null; done
  callgrind_control -i on $PID >/dev/null
  tail -n +21 "$DIR/paths" | while read -r p; do curl -sf "$URL$p" -H "authorization: Bearer $TOKEN" >/dev/null; done
  callgrind_control -i off $PID >/dev/null
  kill $PID; wait $PID || true; PID=
  TOTAL=$(callgrind_annotate "$OUT" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  echo "search ($KIND, 5,000 documents): $((TOTAL / N)) instructions per request, $N requests"
  callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | grep -E "tarn_(engine|store|server)" | head -25 | cut -c1-160 || true
done

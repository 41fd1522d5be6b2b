#!/usr/bin/env bash
# Resident memory and time of `tarn import` and `tarn export` (SQLite) at
# 10,000, 100,000 and 1,000,000 items: both must stay flat as the store grows.
# Usage: [SIZES="10000 100000"] scripts/measure-transfer-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p tarn >/dev/null
T=$(mktemp -d /tmp/tarn-rss.XXXX)
PORT=$((20000 + RANDOM % 20000)); API=http://127.0.0.1:$PORT/api/v1; J='content-type: application/json'
TARN_ADMIN_PASSWORD=rss-admin RUST_LOG=warn ./target/release/tarn serve --listen 127.0.0.1:$PORT --data $T/seed >/dev/null & PID=$!
for _ in $(seq 100); do curl -sf $API/health >/dev/null && break; sleep 0.1; done
curl -s -XPOST $API/users -H "$J" -d '{"username":"owner","password":"owner-password"}' >/dev/null
TOK=$(curl -s -XPOST $API/sessions -H "$J" -d '{"username":"owner","password":"owner-password"}' | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])')
ADM=$(curl -s -XPOST $API/sessions -H "$J" -d '{"username":"admin","password":"rss-admin"}' | python3 -c 'import sys,json;print(json.load(sys.stdin)["token"])')
curl -s -XPUT $API/indexes/doc-by-rank -H "authorization: Bearer $ADM" -H "$J" -d '{"kind":"doc","sort":[{"field":"rank","order":"asc"}]}' >/dev/null
curl -s -XPUT $API/indexes/doc-text -H "authorization: Bearer $ADM" -H "$J" -d '{"kind":"doc","text":[{"field":"title"}]}' >/dev/null
curl -s -XPOST $API/items -H "authorization: Bearer $TOK" -H "$J" -d '{"kind":"doc","properties":{"rank":1,"title":"green tea notes"},"acl":[{"principal":"everyone","role":"viewer"}]}' >/dev/null
sleep 1; kill $PID; wait $PID 2>/dev/null || true
./target/release/tarn export --data $T/seed --out $T/seed.ndjson
for N in ${SIZES:-10000 100000 1000000}; do
  python3 - $T/seed.ndjson $N > $T/in-$N.ndjson <<'PY'
import sys, json, base64, os
seed = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
item = next(r for r in seed if r["type"] == "item")
end = next(r for r in seed if r["type"] == "end")
for r in seed:
    if r["type"] not in ("item", "end"):
        print(json.dumps(r))
out = sys.stdout
end["records"]["item"] = n
for i in range(n):
    r = json.loads(json.dumps(item))
    r["item"]["id"] = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    r["item"]["properties"]["rank"] = i % 1000
    r["item"]["properties"]["title"] = f"green tea note {i}"
    out.write(json.dumps(r) + "\n")
out.write(json.dumps(end) + "\n")
PY
  /usr/bin/time -f "import $N items: %e s, max RSS %M KiB" ./target/release/tarn import --data $T/d-$N --in $T/in-$N.ndjson 2>&1 | tail -1
  /usr/bin/time -f "export $N items: %e s, max RSS %M KiB" ./target/release/tarn export --data $T/d-$N --out $T/out-$N.ndjson 2>&1 | tail -1
  echo "lines in/out: $(wc -l < $T/in-$N.ndjson) / $(wc -l < $T/out-$N.ndjson)"
  rm -rf $T/d-$N $T/in-$N.ndjson $T/out-$N.ndjson
done
rm -rf $T

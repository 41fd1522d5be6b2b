#!/usr/bin/env bash
# Newest-first (Q1, a reversed slice) and oldest-first (forward), by last
# name (Q2, forward), its next page (Q3) and its reverse, one item read and
# /me, on a throwaway three-node Cassandra cluster, at 500 and at 5,000
# homes, each after a flush and a major compaction, then again at 5,000
# homes with the row index made coarse (64 KiB, Cassandra's default for big
# sstables) and the sstables rewritten. Per query: p50 of 200 requests by
# one client, the CPU of the Tarn node and of the three Cassandra nodes per
# request (from /proc, which shared-machine noise moves less than latency),
# and the store's scans and point reads per request (from /metrics).
#   scripts/measure-cassandra-listing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TARN_TEST_CASSANDRA:-}" ]; then
  cargo build --release -p tarn >/dev/null
  exec scripts/with-cassandra.sh "$0" "$@"
fi
BIN=${BIN:-./target/release/tarn}
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()")
TARN_ADMIN_PASSWORD=measure-admin RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:$PORT \
  --store "${TARN_TEST_CASSANDRA%/*}/listing?replication=3" >/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null' EXIT
until curl -sf http://127.0.0.1:$PORT/api/v1/health >/dev/null; do sleep 0.2; done
PIDS="$PID $(cat "$TARN_TEST_CASSANDRA_DIR"/node*/pid | tr '\n' ' ')"
nodetool() { for n in 1 2 3; do "$TARN_TEST_CASSANDRA_CTL" nodetool $n "$@" 2>&1 | grep -vE 'DEBUG|^WARN|^INFO|concurrent_compactors' || true; done; }
settle() { nodetool flush listing; nodetool compact listing; sleep 5; }
client() { python3 - "$PORT" "$@" <<'PY'
import http.client, json, os, random, sys, time, concurrent.futures
port, cmd = int(sys.argv[1]), sys.argv[2]
FIELD = "public.authprofile.basic.elements.lastName"
NAMES = ["smith", "jones", "brown", "taylor", "wilson", "davies", "evans", "thomas"]
def conn(): return http.client.HTTPConnection("127.0.0.1", port)
def req(c, method, url, body=None, h={}):
    c.request(method, url, json.dumps(body) if body is not None else None,
              dict(h, **{"content-type": "application/json"}))
    r = c.getresponse(); return r.status, r.read()
def token(c, user, password):
    s, b = req(c, "POST", "/api/v1/sessions", {"username": user, "password": password})
    return {"authorization": "Bearer " + json.loads(b)["token"]}
if cmd == "setup":
    c = conn()
    for u in ("owner", "reader"):
        req(c, "POST", "/api/v1/users", {"username": u, "password": u + "-password"})
    admin = token(c, "admin", "measure-admin")
    req(c, "PUT", "/api/v1/indexes/by-last-name",
        {"kind": "user-home", "sort": [{"field": FIELD, "order": "asc"}]}, admin)
    while b'"ready"' not in req(c, "GET", "/api/v1/indexes/by-last-name", None, admin)[1]:
        time.sleep(0.5)
elif cmd == "grow":
    have, want = int(sys.argv[3]), int(sys.argv[4])
    owner = token(conn(), "owner", "owner-password")
    def make(i):
        c, r = conn(), random.Random(i)
        home = {"public": {"authprofile": {"basic": {"elements": {
            "lastName": f"{r.choice(NAMES)}{r.randrange(100)}", "firstName": f"u{i}"}}}}}
        for body in ({"kind": "user-home", "properties": home},
                     {"kind": "other", "properties": {"n": i}}):
            body["acl"] = [{"principal": "everyone", "role": "viewer"}]
            s, _ = req(c, "POST", "/api/v1/items", body, owner)
            assert s == 201, s
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        list(ex.map(make, range(have, want)))
else:
    label, pids = sys.argv[3], sys.argv[4:]
    def cpu():
        out = []
        for pid in pids:
            f = open(f"/proc/{pid}/stat").read()
            f = f[f.rfind(")") + 2:].split()
            out.append((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
        return out
    def ops():
        s, b = req(conn(), "GET", "/metrics")
        want = ("tarn_store_cassandra_scans_total", "tarn_store_cassandra_point_reads_total")
        return [float(l.split()[-1]) for w in want for l in b.decode().splitlines()
                if l.startswith(w + " ") or l.startswith(w + "{")]
    c = conn(); reader = token(c, "reader", "reader-password")
    s, b = req(c, "GET", "/api/v1/items?kind=user-home&limit=1", None, reader)
    one = json.loads(b)["items"][0]["id"]
    q2 = f"/api/v1/items?kind=user-home&limit=25&sort={FIELD}"
    s, b = req(c, "GET", q2, None, reader)
    q3 = q2 + "&cursor=" + json.loads(b)["next"]
    for name, url in [("Q1 newest (rev)", "/api/v1/items?kind=user-home&limit=25"),
                      ("Q1 oldest (fwd)", "/api/v1/items?kind=user-home&limit=25&sort=modifiedAt"),
                      ("Q2 by last name", q2),
                      ("Q3 next page", q3),
                      ("Q2 desc (rev)", f"/api/v1/items?kind=user-home&limit=25&sort=-{FIELD}"),
                      ("item read", f"/api/v1/items/{one}"),
                      ("me", "/api/v1/me")] * 2:
        for _ in range(20):
            req(c, "GET", url, None, reader)
        times, c0, o0 = [], cpu(), ops()
        for _ in range(200):
            t = time.perf_counter(); s, _ = req(c, "GET", url, None, reader)
            times.append(time.perf_counter() - t); assert s == 200, s
        c1, o1 = cpu(), ops(); times.sort()
        d = [(b - a) / 200 * 1e3 for a, b in zip(c0, c1)]
        o = [(b - a) / 200 for a, b in zip(o0, o1)]
        print(f"{label:<22} {name:<16} p50 {times[100] * 1e3:7.2f} ms   CPU tarn {d[0]:6.2f} cass {sum(d[1:]):7.2f} ms"
              f"   scans {o[0]:5.1f} point reads {o[1]:5.1f}", flush=True)
PY
}
echo "column_index_size: $("$TARN_TEST_CASSANDRA_CTL" nodetool 1 getcolumnindexsize 2>/dev/null | tail -1)"
client setup
client grow 0 500; settle; client measure "500 homes" $PIDS
client grow 500 5000; settle; client measure "5,000 homes" $PIDS
nodetool setcolumnindexsize 64
nodetool upgradesstables -a listing
sleep 5
client measure "5,000 homes, 64 KiB" $PIDS
echo "$(nproc) cores, $(date -u +%Y-%m-%d)"

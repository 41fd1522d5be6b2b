#!/usr/bin/env python3
"""How long a change written through one Tarn node takes to show in
`/changes` polled on another: N times, create an item on node A, then poll
B's `/changes` from the last cursor until the item is in it.
   scripts/measure-changes-latency.py http://A http://B N
(scripts/measure-changes-latency.sh runs it on a fresh Cassandra cluster.)"""
import json, sys, time, urllib.request, statistics
A, B, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
def call(base, method, path, token=None, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", **({"authorization": "Bearer " + token} if token else {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")
u = "u%d" % int(time.time() * 1000)
call(A, "POST", "/api/v1/users", body={"username": u, "password": u + "-password"})
tok = call(A, "POST", "/api/v1/sessions", body={"username": u, "password": u + "-password"})["token"]
cursor = call(B, "GET", "/api/v1/changes", tok)["next"]
lat, polls, poll_ms = [], [], []
for i in range(N):
    item = call(A, "POST", "/api/v1/items", tok, {"kind": "doc", "properties": {"i": i}})
    t0 = time.monotonic(); n = 0; seen = False
    while not seen:
        p0 = time.monotonic()
        page = call(B, "GET", "/api/v1/changes?since=" + cursor, tok)
        poll_ms.append((time.monotonic() - p0) * 1000); n += 1
        for c in page["changes"]:
            if c["id"] == item["id"]:
                seen = True
        cursor = page["next"]
    lat.append((time.monotonic() - t0) * 1000); polls.append(n)
lat.sort(); poll_ms.sort()
q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]
print("write on A to seen on B by /changes: p50 %.0f ms, p95 %.0f ms, max %.0f ms; polls a change: mean %.2f; one poll p50 %.0f ms" % (
    q(lat, .5), q(lat, .95), lat[-1], statistics.mean(polls), q(poll_ms, .5)))

#!/usr/bin/env python3
# An index build beside creates, two nodes on one PostgreSQL database.
# Four clients create items of one kind through node 2; an index on the
# kind is declared on node 1 and node 2 in turn, waited for, and dropped on
# the other node. Prints, per build: its node, how long it took and over
# how many items, and the creates a second node 2 served meanwhile (mean
# of each second) with the largest p99 of a second.
#   scripts/with-postgres.sh python3 scripts/measure-build-beside-creates.py \
#     target/release/tarn [CYCLES]
import http.client, json, os, random, subprocess, sys, threading, time

BIN = sys.argv[1]
CYCLES = int(sys.argv[2]) if len(sys.argv) > 2 else 6
STORE = os.environ["TARN_TEST_POSTGRES"]
PORTS = [7841, 7842]
_local = threading.local()


def req(port, method, path, token=None, body=None, retry=True):
    conns = _local.__dict__.setdefault("conns", {})
    c = conns.get(port) or conns.setdefault(port, http.client.HTTPConnection("127.0.0.1", port, timeout=60))
    h = {"content-type": "application/json"}
    if token:
        h["authorization"] = "Bearer " + token
    try:
        c.request(method, "/api/v1" + path, json.dumps(body) if body is not None else None, h)
        r = c.getresponse()
        data = r.read()
    except OSError:
        conns.pop(port).close()
        # The server closes a connection left idle for 30 s: a request that
        # may be sent twice is sent again on a new one.
        if retry and method != "POST":
            return req(port, method, path, token, body, retry=False)
        raise
    return r.status, json.loads(data) if data else None


def signin(name, password):
    status, out = req(PORTS[0], "POST", "/sessions", body={"username": name, "password": password})
    assert status == 201, (status, out)
    return out["token"]


nodes = []
for port in PORTS:
    env = dict(os.environ, TARN_ADMIN_PASSWORD="admin-secret")
    nodes.append(subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port}", "--store", STORE],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
try:
    for port in PORTS:
        for _ in range(200):
            try:
                if req(port, "GET", "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
    admin = signin("admin", "admin-secret")
    req(PORTS[0], "POST", "/users", body={"username": "writer", "password": "password1"})
    writer = signin("writer", "password1")
    stop = False
    done = []  # (end time, seconds) of each create
    lock = threading.Lock()

    def create():
        while not stop:
            t = time.time()
            status, out = req(PORTS[1], "POST", "/items", writer,
                              {"kind": "dd", "properties": {"n": random.randint(0, 10**6)}})
            assert status == 201, (status, out)
            with lock:
                done.append((time.time(), time.time() - t))

    writers = [threading.Thread(target=create) for _ in range(4)]
    for w in writers:
        w.start()
    time.sleep(10)
    for cycle in range(CYCLES):
        node = cycle % 2
        order = "asc" if cycle % 2 == 0 else "desc"
        with lock:
            items = len(done)
        began = time.time()
        status, out = req(PORTS[node], "PUT", "/indexes/dd-n", admin,
                          {"kind": "dd", "sort": [{"field": "n", "order": order}]})
        assert status in (200, 201), (status, out)
        while req(PORTS[0], "GET", "/indexes/dd-n", admin)[1]["state"] != "ready":
            time.sleep(0.1)
        ended = time.time()
        with lock:
            during = [(t, s) for t, s in done if began <= t < ended]
        seconds = [[s for t, s in during if int(t - began) == k] for k in range(int(ended - began))]
        rates = [len(s) for s in seconds] or [len(during)]
        p99s = [sorted(s)[int(len(s) * 0.99)] * 1000 for s in seconds if s]
        print(f"build {cycle} on node {node + 1}: {ended - began:.1f} s over {items} items; "
              f"node 2 served {sum(rates) / len(rates):.0f} creates a second, "
              f"p99 of a second at most {max(p99s, default=0):.0f} ms", flush=True)
        time.sleep(2)
        status, _ = req(PORTS[1 - node], "DELETE", "/indexes/dd-n", admin)
        assert status == 204, status
        time.sleep(2)
    stop = True
    for w in writers:
        w.join()
finally:
    for n in nodes:
        n.terminate()
        n.wait()

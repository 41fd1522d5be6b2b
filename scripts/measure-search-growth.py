#!/usr/bin/env python3
"""Search latency for one reader whose share stays fixed while the pool grows.

Starts a release `tarn serve` on a temp directory, shares 500 documents
with a reader, measures the reader's search p50 (one client, 500 searches
after 100 warm-up ones), lets another user add documents the reader cannot
read (default 10,000: the pool grows 21x), and measures again. With
STORE=postgres://... or cassandra://... it serves over that store (which
must be empty) instead of SQLite in a temp directory:
    scripts/measure-search-growth.py [ADDED]   (after cargo build --release -p tarn)
    scripts/with-postgres.sh sh -c 'STORE=$TARN_TEST_POSTGRES scripts/measure-search-growth.py'
"""
import json, os, random, statistics, subprocess, sys, tempfile, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDED = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
PORT = 20000 + random.randint(0, 19999)
API = f"http://127.0.0.1:{PORT}/api/v1"


def req(method, path, body=None, tok=None):
    h = {"content-type": "application/json"}
    if tok:
        h["authorization"] = "Bearer " + tok
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(API + path, data=data, headers=h, method=method)
    with urllib.request.urlopen(r) as f:
        return json.loads(f.read() or b"null")


def main():
    data = tempfile.mkdtemp()
    env = dict(os.environ, TARN_ADMIN_PASSWORD="measure-admin", RUST_LOG="warn")
    store = ["--store", os.environ["STORE"]] if os.environ.get("STORE") else []
    srv = subprocess.Popen([f"{ROOT}/target/release/tarn", "serve", "--listen", f"127.0.0.1:{PORT}",
                            "--data", f"{data}/data"] + store, env=env, stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                req("GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        tok = {}
        for u in ["reader", "other"]:
            req("POST", "/users", {"username": u, "password": u + "-password"})
            tok[u] = req("POST", "/sessions", {"username": u, "password": u + "-password"})["token"]
        admin = req("POST", "/sessions", {"username": "admin", "password": "measure-admin"})["token"]
        req("PUT", "/indexes/doc-text", {"kind": "document", "text": [
            {"field": "title", "weight": 3}, {"field": "description"}]}, admin)
        vocab = [f"w{i}" for i in range(5000)] + ["green", "tea", "oolong", "kettle"]
        weights = [1.0 / (i + 1) for i in range(len(vocab))]

        def create(share):
            acl = [{"principal": "user:reader", "role": "viewer"}] if share else []
            doc = {"kind": "document", "acl": acl, "properties": {
                "title": " ".join(random.choices(vocab, weights, k=5)),
                "description": " ".join(random.choices(vocab, weights, k=random.randint(20, 200)))}}
            req("POST", "/items", doc, tok["other"])

        def load(n, share):
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda _: create(share), range(n)))

        queries = ["w1%20w3", "w10%20w20", "w2", "w50%20w7", "w100", "green%20tea"]

        def p50():
            lat = []
            for i in range(600):
                t = time.perf_counter()
                req("GET", f"/search?kind=document&q={queries[i % len(queries)]}", tok=tok["reader"])
                lat.append(time.perf_counter() - t)
            return statistics.median(lat[100:]) * 1000

        load(500, True)
        before = p50()
        load(ADDED, False)
        after = p50()
        print(f"reader's share 500 documents; pool 500 -> {500 + ADDED}: search p50 "
              f"{before:.2f} -> {after:.2f} ms, ratio {after / before:.2f}")
    finally:
        srv.terminate()
        srv.wait()
        subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()

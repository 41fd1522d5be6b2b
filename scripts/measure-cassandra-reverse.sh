#!/usr/bin/env bash
# Cassandra alone, no Tarn: a reversed and a forward clustering slice
# (LIMIT 4, QUORUM, Tarn's table layout and statements' shape) over 16
# partitions of 31, 312 and 3,000 rows (a user-home index bucket at 500,
# 5,000 and about 50,000 homes), after a flush and a major compaction, with
# partition rows indexed every 4 KiB, then every 64 KiB (Cassandra's
# default) after rewriting the sstables. Milliseconds a query, one client.
#   scripts/measure-cassandra-reverse.sh
# Uses the Python driver (cassandra-driver 3.30.1, in a virtualenv under
# ${XDG_CACHE_HOME:-~/.cache}/tarn) and a throwaway cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/tarn/venv-cassandra-driver-3.30.1
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q cassandra-driver==3.30.1
fi
exec scripts/with-cassandra.sh "$VENV/bin/python" - <<'PY'
import os, subprocess, time
from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent_with_args

ctl = os.environ["TARN_TEST_CASSANDRA_CTL"]
def nodetool(*args):
    for n in "123":
        subprocess.run([ctl, "nodetool", n, *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
s = Cluster(["127.0.0.1"]).connect()
s.execute("CREATE KEYSPACE rb WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
s.execute("CREATE TABLE rb.rows (tbl text, part blob, kind tinyint, clus blob, value blob, "
          "version bigint, intent_at bigint, PRIMARY KEY ((tbl, part), kind, clus))")
put = s.prepare("INSERT INTO rb.rows (tbl, part, kind, clus, value, version) VALUES (?, ?, 0, ?, ?, 1)")
slices = {
    "reversed": s.prepare("SELECT clus, value, version FROM rb.rows WHERE tbl = ? AND part = ? AND kind = 0 "
                          "ORDER BY kind DESC, clus DESC LIMIT 4"),
    "forward": s.prepare("SELECT clus, value, version FROM rb.rows WHERE tbl = ? AND part = ? AND kind = 0 "
                         "ORDER BY kind ASC, clus ASC LIMIT 4"),
}
for q in slices.values():
    q.consistency_level = ConsistencyLevel.QUORUM
sizes = {"31 rows": 31, "312 rows": 312, "3,000 rows": 3000}
for tbl, n in sizes.items():
    # An index row's clustering key: a sort value and a 16-byte id.
    execute_concurrent_with_args(s, put, [(tbl, bytes([p]), i.to_bytes(8, "big") + os.urandom(16), b"")
                                          for p in range(16) for i in range(n)], concurrency=64)
nodetool("flush", "rb")
nodetool("compact", "rb")
def measure(setting):
    for tbl in sizes:
        for name, q in list(slices.items()) * 2:
            for p in range(16):
                s.execute(q, (tbl, bytes([p])))
            t = time.perf_counter()
            for _ in range(40):
                for p in range(16):
                    s.execute(q, (tbl, bytes([p])))
            print(f"{setting:<18} {tbl:<11} {name:<9} {(time.perf_counter() - t) / 640 * 1e3:6.3f} ms a query", flush=True)
measure("rows indexed 4KiB")
nodetool("setcolumnindexsize", "64")
nodetool("upgradesstables", "-a", "rb")
measure("rows indexed 64KiB")
print(f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d', time.gmtime())}")
PY

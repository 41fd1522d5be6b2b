#!/usr/bin/env bash
# Run by `tarn bench --after-load` on the test cluster (scripts/bench-nodes.sh
# with STORE=cassandra): flushes every node's memtables, then waits until no
# node has a compaction pending or running, so that each pool size is read
# from sstables on a cluster that is done with its load. Fails if nodetool
# does, or if compactions still run 10 minutes after the flush. Says on
# stderr how long the flush and the wait took together.
set -euo pipefail
CTL=${TARN_TEST_CASSANDRA_CTL:?run under scripts/with-cassandra.sh}
start=$(date +%s)
for n in 1 2 3; do "$CTL" nodetool "$n" flush >/dev/null; done
busy() { # node: is a compaction pending or running?
  local out
  out=$("$CTL" nodetool "$1" compactionstats) || { echo "after-load: nodetool compactionstats failed on node $1" >&2; exit 1; }
  awk '
    /^pending tasks/ { seen = 1; if ($NF != 0) busy = 1 }
    /compaction type/ { busy = 1 }
    END { exit !(busy || !seen) }' <<<"$out"
}
while (( $(date +%s) - start < 600 )); do
  quiet=1
  for n in 1 2 3; do if busy "$n"; then quiet=0; fi; done
  if [ $quiet = 1 ]; then
    echo "after-load: flushed, and no compaction left, after $(( $(date +%s) - start )) s" >&2
    exit 0
  fi
  sleep 5
done
echo "after-load: compactions still running $(( $(date +%s) - start )) s after the flush" >&2
exit 1

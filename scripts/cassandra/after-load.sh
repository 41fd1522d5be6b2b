#!/usr/bin/env bash
# Run by `tarn bench --after-load` on the test cluster (scripts/bench-nodes.sh
# with STORE=cassandra): flushes every node's memtables, then waits until no
# node has a compaction pending or running (at most 10 minutes), so that each
# pool size is read from sstables on a cluster that is done with its load.
# Says on stderr how long the compactions took.
set -euo pipefail
CTL=${TARN_TEST_CASSANDRA_CTL:?run under scripts/with-cassandra.sh}
start=$(date +%s)
for n in 1 2 3; do "$CTL" nodetool "$n" flush >/dev/null; done
busy() { # node: is a compaction pending or running?
  "$CTL" nodetool "$1" compactionstats 2>/dev/null | awk '
    /^pending tasks/ { seen = 1; if ($NF != 0) busy = 1 }
    /compaction type/ { busy = 1 }
    END { exit !(busy || !seen) }'
}
for _ in $(seq 1 120); do
  quiet=1
  for n in 1 2 3; do if busy "$n"; then quiet=0; fi; done
  if [ $quiet = 1 ]; then
    echo "after-load: flushed; no compaction left after $(( $(date +%s) - start )) s" >&2
    exit 0
  fi
  sleep 5
done
echo "after-load: compactions still running after $(( $(date +%s) - start )) s" >&2
exit 1
